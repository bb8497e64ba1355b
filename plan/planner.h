/* planner.h - from a (partitioned) step graph to an execution plan (the compiler side of plan/).
 *
 * Lowering walks the graph in order and turns every node into instructions over buffers:
 *   - parameters, optimizer state and inputs become persistent or fed buffers;
 *   - a reshape becomes a view (no instruction, no bytes);
 *   - a matmul becomes a GEMM, and a transpose whose every consumer is such a GEMM is folded into
 *     it as a transposed operand (no instruction, no bytes);
 *   - collectives become collective instructions over the group of their mesh axis;
 *   - an elementwise op, an activation gradient, the vocabulary-parallel cross-entropy's
 *     gradient or an optimizer update writes over an operand whose bytes are free after it (in
 *     place);
 *   - an op over bf16/f16 storage reads f32 copies and writes an f32 result that is rounded into
 *     the 16-bit buffer (the kernels compute in f32: what the reference semantics say); a 16-bit
 *     matmul is a GEMM over the 16-bit operands (gemm.ab) that rounds its f32 sums into the
 *     16-bit result itself (gemm.cd); the fusion pass then folds most of the casts into its
 *     kernels;
 *   - a state update that could not run in place becomes a copy at the end of the step.
 * Then every buffer gets its region and the static memory planner its offset (memplan.c).
 */
#ifndef PTC_PLANNER_H
#define PTC_PLANNER_H

#include "program.h"

typedef struct ptc_lower_opts {
    int zero;
    bool seq_parallel;
    int64_t logical_params;
    double model_flops; /* of a training step (ptc_graph_model_flops), for MFU; 0: unknown */
    /* keep the graph's gradient outputs (1..) readable after a step (single-device gradient
     * dumps); otherwise they are freed like any temporary */
    bool keep_grad_outputs;
    const char *notes; /* the passes' notes on their choices, carried into the plan */
    /* the compile mesh, with its pipeline axis "pp" (naxes 0: the graph's mesh without "mb") */
    ptc_mesh mesh;
    int pp_schedule;    /* ptc_pp_schedule (schedule.h): the order of microbatches and stages */
    int virtual_stages; /* model chunks per pipeline rank (interleaved) */
    /* run the fusion pass (fuse.c) before memory planning */
    bool fuse;
    /* with fuse: the language-model head over this many row chunks (0: auto, chunks of at most
     * PTC_HEAD_CHUNK_BYTES of logits; 1: one, as it was) */
    int head_chunks;
    /* every graph output is a program output, readable after a run (a forward-only plan: the
     * sampling program's logits); otherwise output 0 is the gradient norm and 1.. gradients */
    bool forward_outputs;
} ptc_lower_opts;

/* Lowers g (every rank runs the same program: g is an SPMD program or single-device). Returns the
 * plan with its memory planned, or NULL with a message. */
ptc_plan *ptc_lower(const ptc_graph *g, const ptc_lower_opts *o, char *err, size_t errn);

/* The sampling program of a language model (sample.c): the forward pass of one device up to the
 * logits of g's cross-entropy (g: the model's graph after the passes that run without training,
 * no mesh), the logits its one output. NULL with the reason in why when the model has no such
 * logits or cannot predict a next token (an attention that is not causal). */
ptc_plan *ptc_lower_sample(const ptc_graph *g, bool fuse, char *why, size_t whyn);

/* The fusion pass (fuse.c): runs of kernels become generated kernels (fused instructions), their
 * intermediates leave the program. On a lowered plan before memory planning. */
void ptc_plan_fuse(ptc_plan *p, int head_chunks);
#define PTC_HEAD_CHUNK_BYTES ((int64_t)256 << 20)
/* Its first step on each program (fold_casts.c): the casts around an op of ptc_op_storage16
 * over 16-bit tensors fold into it, which then reads and writes those tensors itself. */
void ptc_plan_fold_casts(ptc_program *pg);

/* The static memory planner: offsets for every buffer of every program and the arena size of every
 * region. Persistent regions (parameters, gradients, optimizer state) lay buffers out in order;
 * activations are placed greedy by size with best fit over their lifetimes (the heuristic of
 * TFLite's arena planner and XLA's GlobalDecreasingSizeBestFitHeap): largest buffer first, each
 * into the smallest gap between the buffers already placed whose lifetimes overlap its own, or
 * above them all. Views take their root's offset. */
void ptc_plan_memory(ptc_plan *p);

#endif
