#!/usr/bin/env python3
"""Equivalence matrix: every parallel plan trains like the single-device program it came from.

For mlp, gpt2_tiny, llama_tiny and bert_tiny (an encoder: no causal mask, post-layernorm), and
every mesh dp x tp with dp, tp in {1, 2, 4} and at most 8
ranks (and tests/golden/ir/every_op.ptm, which uses every op of the language, on the meshes its
batch of 2 and its 2 heads divide), with and without sequence parallelism (when tp > 1) and ZeRO 0..3 (when dp > 1), this
and a covering set of pipeline and microbatch plans (PIPELINES: every schedule on pp=2 and pp=4,
with dp, tp, SP, ZeRO 1-3 and recompute; microbatches 1-8; and the language-model head in
chunks of rows, --head-chunks, on one device, dp and ZeRO), this
compiles the plan with ptc, trains it 3 steps on the CPU (ranks as threads), on the reference
backend (the plan compiled with --no-fuse: one reference kernel per op) and on the jit backend
(the default, on the fused plan: the cpu backend's kernels and GEMMs with the
plan's fused kernels compiled through LLVM), and compares with the single-device run of the same model,
consts, seed and backend. moe_tiny (mixture of experts) runs dropless and with capacity 1.0
(tokens are dropped: the step log says how many), each over two dp x tp meshes (dp=2; tp=2 with
SP: the dense models cover the rest of dp x tp) and over every mesh dp x ep x tp with ep in {2, 4} (dp, tp in {1, 2}, at most 8 ranks), ZeRO 0 and 1, with
sequence parallelism where tp > 1: dropping and everything else must be the single device's on
every mesh; and with capacity 1.0 and 2 microbatches (routed one microbatch at a time) over dp,
ep, dp x ep x tp, pp, pp x ep and pp x dp x ep against the single device with 2 microbatches.
tests/equivalence/shared_tiny.ptm (weights every layer uses, and a tied embedding) runs four
pipelines: the gradients each stage sums over the microbatches before the stages' totals meet.
Each run is checked so:
  - the loss of every step: relative error below 1e-5;
  - every final weight (gathered into full tensors by the runner's --save): max |a - b| / max |b|
    over each tensor below 1e-4;
  - memory: every run fills its arenas with a canary (--check-memory) and every rank's measured
    high-water mark of every arena must equal the plan's figure byte for byte;
  - mixture of experts: the fraction of choices dropped at every step (the step log's
    "dropped") must equal the single device's exactly, and a capacity variant must drop some.

Why these tolerances are right for fp32. The plans compute the same sums in different orders
(partial sums over tensor-parallel shards, over data-parallel batch slices, reduce-scatter vs
allreduce), so values differ by float rounding: relative 1e-7 per operation, growing to ~1e-6
through a few dozen dependent ops, which the loss check (1e-5) bounds with margin. Weights go
through AdamW, whose update m / (sqrt(v) + eps) divides each gradient element by its own size: an
element whose true gradient is about 0 (GPT-2's key bias gets exactly 0: adding a constant to every
score of a row leaves softmax unchanged) gets an update whose sign is decided by rounding noise,
amplified by lr / eps. With the models' eps = 1e-8 that amplification is 1e5, and plans that agree
to 1e-7 differ by 1e-4 in such weights. The matrix therefore compiles with --optim eps=1e-5,
bounding the amplification at 1e2 while exercising the same code (not for SGD models, whose
optimizer has no eps). With eps=1e-6 (amplification 1e3) the unfused plans' worst case was
about 2e-5, but fused plans fuse differently on different meshes (nothing fuses across pipeline
work or a send), which adds rounding differences, and the worst grew to 1.1e-4 (gpt2_tiny's
key bias at pp=2,dp=2 ZeRO-3, jit); hence 1e-5. Everything else (lr 1e-3, betas, weight decay, clipping at 1.0) is the models'.

Mixed precision (--precision bf16 or fp16): every plan and the single-device reference compiled
with that --precision, on the jit backend alone, with the tolerances of PRECISION_TOL below and
the reason for them there.

Usage: matrix.py PTC [--models a,b] [--quick] [--precision P] [--device cuda-emulated|cuda]
(exit 0 all pass, 1 any failure). --device runs every plan, and the single device it is held
against, on the CUDA backend instead (cuda-emulated: on the host emulation of the GPU).
--quick leaves out sequence parallelism and ZeRO 1 and 2, and for moe_tiny all but its capacity
variants on meshes with ep or pp, and runs the jit backend alone (the fused plan: compiled
kernels and the cpu backend's for the rest), not ref, whose double-precision kernels take 10
times as long in a debug build with the sanitizers (what CI runs there, in 90 s; the full run
covers ref).
"""
import json
import operator
import os
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 3
LOSS_TOL = 1e-5
WEIGHT_TOL = 1e-4
# ref runs the unfused plans, jit the fused ones compiled (cpu alone would interpret the fused
# kernels: test_fuse checks that path)
BACKENDS = ('ref', 'jit')


def load_safetensors(path):
    with open(path, 'rb') as f:
        data = f.read()
    n = struct.unpack('<Q', data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == '__metadata__':
            continue
        s, e = t['data_offsets']
        out[name] = struct.unpack('<%df' % ((e - s) // 4), data[base + s:base + e])
    return out


# model name -> (path relative to the repository, largest dp and tp it divides)
MODELS = {
    'mlp': ('examples/mlp.ptm', 4, 4),
    'gpt2_tiny': ('examples/gpt2_tiny.ptm', 4, 4),
    'llama_tiny': ('examples/llama_tiny.ptm', 4, 4),
    'bert_tiny': ('examples/bert_tiny.ptm', 4, 4),
    'every_op': ('tests/golden/ir/every_op.ptm', 2, 2),
    'moe_tiny': ('examples/moe_tiny.ptm', 2, 2),
    # weights used by every layer and a tied embedding: its pipelines below (no dp x tp meshes)
    'shared_tiny': ('tests/equivalence/shared_tiny.ptm', 1, 1),
}

# Pipelines and microbatches: a covering set, not the cross product. Every schedule on pp=2 and
# pp=4; each of dp, tp, SP, ZeRO-1/2/3 with pp at least once; recompute none, selective and full
# with pp; M = 1, 2, 4 and 8; interleaved with V=2 on pp=2 and pp=4; microbatches without pp with
# ZeRO-3 and SP. (model, consts, args); the single-device reference is the model with the same
# consts. gpt2_tiny gets 6 layers (pp=4 interleaved has 8 virtual stages) and a batch of 8 (dp=2
# x 4 microbatches).
G6 = ('-D', 'layers=6', '-D', 'batch=8')
L4 = ('-D', 'n_layers=4', '-D', 'batch=8')
B4 = ('-D', 'layers=4', '-D', 'batch=8')
PIPELINES = [
    ('gpt2_tiny', G6, '--mesh pp=2'),
    ('gpt2_tiny', G6, '--mesh pp=2,dp=2 --microbatches 2 --pp-schedule gpipe'),
    ('gpt2_tiny', G6, '--mesh pp=2,tp=2 --seq-parallel --microbatches 4'),
    ('gpt2_tiny', G6, '--mesh pp=2 --microbatches 8 --pp-schedule zb-h1'),
    ('gpt2_tiny', G6, '--mesh pp=2,dp=2 --zero 1 --microbatches 4 --pp-schedule interleaved'),
    ('gpt2_tiny', G6, '--mesh pp=4 --microbatches 8 --recompute full'),
    ('gpt2_tiny', G6, '--mesh pp=4,tp=2 --microbatches 4 --pp-schedule gpipe '
                      '--recompute selective'),
    ('gpt2_tiny', G6, '--mesh pp=4 --microbatches 8 --pp-schedule interleaved'),
    ('gpt2_tiny', G6, '--mesh pp=4 --microbatches 4 --pp-schedule zb-h1 --recompute full'),
    ('gpt2_tiny', G6, '--mesh pp=2,dp=2,tp=2 --seq-parallel --zero 1 --microbatches 4 '
                      '--recompute selective'),
    ('gpt2_tiny', G6, '--mesh pp=2,dp=2 --zero 2 --microbatches 2'),
    ('gpt2_tiny', G6, '--mesh pp=2,dp=2 --zero 3 --microbatches 2 --recompute full'),
    ('gpt2_tiny', G6, '--mesh dp=2 --zero 3 --microbatches 4'),
    ('llama_tiny', L4, '--mesh pp=2,tp=2 --microbatches 2'),
    ('llama_tiny', L4, '--mesh pp=4 --microbatches 4 --pp-schedule zb-h1 --recompute full'),
    ('llama_tiny', L4, '--mesh tp=2 --seq-parallel --microbatches 2 --recompute selective'),
    ('bert_tiny', B4, '--mesh pp=2,dp=2 --microbatches 4 --pp-schedule interleaved'),
    ('bert_tiny', B4, '--mesh pp=4 --microbatches 2 --recompute full'),
    # gradients summed on every stage over the microbatches, then across the stages
    ('shared_tiny', (), '--mesh pp=2 --microbatches 4'),
    ('shared_tiny', (), '--mesh pp=4 --microbatches 4 --pp-schedule zb-h1'),
    ('shared_tiny', (), '--mesh pp=2,dp=2 --zero 2 --microbatches 2 --pp-schedule interleaved'),
    ('shared_tiny', (), '--mesh pp=4 --microbatches 8 --recompute full'),
    # the language-model head in chunks of rows (plan/fuse.c; the default chunks only logits of
    # more than 256 MiB): tied (gpt2, bert, shared) and untied (llama) heads, uneven chunks (3 of
    # gpt2_tiny's 256 rows: 88, 88, 80), the weight gathered under ZeRO-3 between the loss and the
    # head's backward, the loss reduced over dp, and a recomputed model; ref runs the plan unfused
    # (one chunk)
    ('gpt2_tiny', (), '--head-chunks 3'),
    ('gpt2_tiny', (), '--mesh dp=2 --zero 3 --head-chunks 2'),
    ('gpt2_tiny', (), '--recompute full --head-chunks 4'),
    ('llama_tiny', (), '--head-chunks 3'),
    ('bert_tiny', (), '--mesh dp=2 --zero 1 --head-chunks 3'),
    ('shared_tiny', (), '--head-chunks 2'),
]
QUICK_PIPELINES = (2, 9, 14, 19, 23, 25)  # indices kept by --quick


# a mesh to run: (pp, dp, ep, tp, sequence parallel, ZeRO stage)
def configs(max_dp, max_tp):
    for dp in (d for d in (1, 2, 4) if d <= max_dp):
        for tp in (t for t in (1, 2, 4) if t <= max_tp):
            if dp * tp > 8 or dp * tp == 1:
                continue
            for sp in ([False, True] if tp > 1 else [False]):
                for zero in (range(4) if dp > 1 else [0]):
                    yield 1, dp, 1, tp, sp, zero


def ep_configs():
    for ep in (2, 4):
        for dp in (1, 2):
            for tp in (1, 2):
                if dp * ep * tp > 8:
                    continue
                # ZeRO shards over dp and ep (the experts over dp alone): every stage
                # without tp, 0 and 1 with it
                for sp in ([False, True] if tp > 1 else [False]):
                    for zero in ([0, 1] if tp > 1 else [0, 1, 2, 3]):
                        yield 1, dp, ep, tp, sp, zero


# With microbatches a mixture-of-experts layer routes each microbatch's tokens together: the
# single-device reference has the same --microbatches, and every mesh must equal it, pipelines
# included.
MB_MESHES = [(1, 2, 1, 1, False, 0), (1, 1, 2, 1, False, 0), (1, 2, 2, 2, False, 1),
             (2, 1, 1, 1, False, 0), (2, 1, 2, 1, False, 0), (2, 2, 2, 1, False, 1)]

# models with mixture-of-experts layers: the variants compiled (each its own single-device
# reference) and the meshes they run on
MOE = {
    'moe_tiny': [('dropless', [], None), ('capacity 1.0', ['-D', 'capacity_factor=1.0'], None),
                 ('capacity 1.0 microbatches 2',
                  ['-D', 'capacity_factor=1.0', '--microbatches', '2'], MB_MESHES)],
}


# --precision: 16-bit activations and weights. A result every plan computes in f32 differs between
# plans by float rounding (~1e-7, as above), and rounding that result to bf16 turns a difference
# of one f32 ulp into one of a bf16 ulp (2^-8 = 4e-3 relative) whenever the value lies near the
# middle between two bf16 numbers; each flipped element carries its 4e-3 onward, and the steps'
# updates carry them into the next step's loss. The first step's loss is a mean over every token
# and averages the flips (equal to 1e-5 on every mesh); the second and third follow updates made
# from gradients with flips in them. Measured over the whole matrix: 9.3e-4 at most (every_op,
# whose mse term against an N(0, 1) target makes its loss 270 and its updates large), 2.4e-4 for
# the others. LOSS 5e-3 (below one bf16 ulp, 7.8e-3) fails a plan that loses a microbatch, a
# shard or a collective: that moves a loss by a whole term.
# Weights: AdamW's m / (sqrt(v) + eps) makes every element's update about +-lr whatever its
# gradient, so an element whose gradient is bf16 rounding noise (a key bias, whose true gradient is
# 0) moves by +-lr at random, as large as any real update. Under --precision the matrix therefore
# trains with eps=1, where the update lr * m / (sqrt(v) + 1) is linear in the gradient for the
# gradients these models have (|g| << 1), at lr 0.3 (at lr 1e-3 a norm gain of 1.0 would move by
# a few f32 ulps and the comparison would measure their rounding; at lr 1 every_op's steps grow
# chaotic), and compares what the steps changed: the weights minus the initial ones,
# max |delta - delta_ref| over max |delta_ref| per tensor, which is then the gradients' own
# agreement. Measured: 2.7e-2 at most (mlp's first layer under SGD), 1.7e-2 for the AdamW models.
# WEIGHTS 5e-2 fails a plan whose gradient of a tensor is wrong by 5% of its largest element; a
# lost term (half the microbatches, one shard's part) is 50% and more.
# (SGD's update lr * g is linear already: mlp keeps its own lr, 0.05, under which a step is
# small enough not to amplify the differences the way lr 1 would through its momentum.)
PRECISION = None
LR_OF = {}  # compiled executable -> the --lr its runs take
# Under --precision the weights compared are what the steps changed: the final weights minus the
# initial ones. Initialisation is a function of the model, its consts and the seed alone (each
# element from its index in the full tensor, whatever the mesh: the fp32 matrix holds every plan's
# final weights to its single device's, which it could not with another start), so the initial
# weights are taken once per model and consts (INIT: that key -> the weights) and every plan of
# them is held to the same start; a plan that started elsewhere shows as a difference in what
# its steps changed. (One run per key instead of one per plan: a third of the 16-bit matrices.)
INIT_KEY = {}  # compiled executable -> (model, its -D consts)
INIT = {}
PRECISION_TOL = {'bf16': (5e-3, 5e-2), 'fp16': (5e-3, 5e-2)}


def compile_plan(ptc, model, args, work, tag):
    exe = os.path.join(work, tag)
    if PRECISION:
        args = ['--precision', PRECISION] + list(args)
    # eps is AdamW's: ptc refuses a setting the model's optimizer lacks, and mlp trains with SGD
    with open(model) as f:
        sgd = 'optimizer sgd' in f.read()
    optim = [] if sgd else ['--optim', 'eps=1' if PRECISION else 'eps=1e-5']
    LR_OF[exe] = '1e-3' if not PRECISION else '0.05' if sgd else '0.3'
    INIT_KEY[exe] = (model, tuple(a for i, a in enumerate(args) if a.startswith('-D') or
                                  (i and args[i - 1] == '-D')))
    # the reference backend runs the unfused plan (the reference kernels, one per op: what
    # every fused kernel is held against); jit runs the fused plan, as users get it
    unfused = [(exe + '-nofuse', ['--no-fuse'])] if {'ref', 'cpu'} & set(BACKENDS) else []
    for out, fuse in [(exe, [])] + unfused:
        # (--head-chunks is a part of the fusion pass: the unfused plan runs the head whole)
        plain = [a for i, a in enumerate(args) if a != '--head-chunks' and
                 (i == 0 or args[i - 1] != '--head-chunks')] if fuse else list(args)
        cmd = [ptc] + optim + fuse + plain + [model, '-o', out]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            return None, 'compile failed: %s\n%s' % (' '.join(cmd), r.stderr.strip())
    return exe, None


def where(backend):
    """the runner's flags that pick backend (cuda-emulated: the CUDA backend, emulated GPU)"""
    return ['--device', backend] if backend.startswith('cuda') else ['--backend', backend]


def run_plan(exe, backend):
    if backend in ('ref', 'cpu'):
        exe += '-nofuse'
    log, weights = exe + '.' + backend + '.jsonl', exe + '.' + backend + '.safetensors'
    run = [exe, '--steps', str(STEPS)] + where(backend) + ['--lr',
           LR_OF.get(exe.replace('-nofuse', ''), '1e-3'), '--schedule',
           'constant', '--seed', '5', '--quiet', '--log', log, '--save', weights,
           '--comm-timeout', '120', '--check-memory']
    if PRECISION == 'fp16':
        # loss scale 1: every_op's gradients (its loss is 270) overflow fp16 at any larger scale,
        # and a skipped step leaves its update's buffers untouched, which --check-memory reports
        # (skipping itself is tests/train/fp16_loss_scale.py's subject)
        run += ['--loss-scale', '1']
    r = subprocess.run(run, capture_output=True, text=True)
    if r.returncode:
        return None, 'run failed: %s\n%s' % (' '.join(run), r.stderr.strip())
    weights_now = load_safetensors(weights)
    if PRECISION:  # what the steps changed: minus the initial weights (one step at lr 1e-30)
        key = INIT_KEY[exe.replace('-nofuse', '')] + (backend,)
        if key not in INIT:
            r = subprocess.run([exe, '--steps', '1'] + where(backend) + ['--lr', '1e-30',
                                '--seed', '5', '--quiet', '--save', weights + '.init'],
                               capture_output=True, text=True)
            if r.returncode:
                return None, 'run failed (initial weights): %s' % r.stderr.strip()
            INIT[key] = load_safetensors(weights + '.init')
        init = INIT[key]
        if set(init) != set(weights_now):
            return None, 'tensors differ from the initial weights: %s' % sorted(
                set(init) ^ set(weights_now))
        weights_now = {k: list(map(operator.sub, v, init[k])) for k, v in weights_now.items()}
    records = [json.loads(line) for line in open(log)]
    losses = [x['loss'] for x in records if 'loss' in x]
    dropped = [x.get('dropped') for x in records if 'loss' in x]
    memory = [x['memory'] for x in records if 'memory' in x]
    bad = [m for m in memory if m['planned'] != m['measured']]
    if not memory or bad:
        return None, 'memory check failed: %s' % (bad or 'no memory records in the log')
    return (losses, weights_now, dropped), None


# Mixture of experts under --precision: a router scores tokens in f32 (the moe pass casts its
# input and weights up), but its input is a 16-bit activation, which differs between plans by a
# bf16 rounding here and there (above). A token whose two best experts score within that rounding
# of each other can go to the other expert on another mesh, and with a capacity a place taken by
# one token is then missing for another: such flips are a property of routing on rounded values
# (every 16-bit MoE framework has them), not a fault of the plan. moe_tiny makes 1024 choices a
# step (8 x 32 tokens, top 2, 2 layers); measured, at most 1 of them differs on any mesh. So under
# --precision the dropped fraction may differ by 2 choices a step, and the weights of a moe model
# by MOE_WEIGHT_TOL: one token's contribution through a different expert changes the gradient of
# the norm before the experts (a sum over every token that nearly cancels) by a large part of its
# largest element (measured 16%); a plan that loses a term is off by 100%.
MOE_DROP_TOL = 2.0 / 1024
MOE_WEIGHT_TOL = 0.3


def compare(ref, got, stages=1):
    (rl, rw, rd), (gl, gw, gd) = ref, got
    flips = PRECISION and rd and all(a is not None and b is not None and
                                     abs(a - b) <= MOE_DROP_TOL for a, b in zip(gd, rd))
    if rd != gd and stages == 1 and not flips:  # (with stages the log has the first stage's)
        return 0.0, float('inf'), 'dropped %s, single device %s' % (gd, rd)
    worst_loss = max(abs(a - b) / abs(b) for a, b in zip(gl, rl))
    worst_w, where = 0.0, ''
    if set(rw) != set(gw):
        return worst_loss, float('inf'), 'tensors differ: %s' % sorted(set(rw) ^ set(gw))
    for name, ref_t in rw.items():  # (map and operator: the loops in C, a third of the run)
        scale = max(map(abs, ref_t), default=0.0) or 1.0
        d = max(map(abs, map(operator.sub, gw[name], ref_t)), default=0.0) / scale
        if d > worst_w:
            worst_w, where = d, name
    return worst_loss, worst_w, where


def pipelines(ptc, models, quick, work):
    """The PIPELINES configs (and the head's chunks) against single-device runs of the same
    consts."""
    passes = failures = 0
    refs = {}
    for k, (model, consts, args) in enumerate(PIPELINES):
        if model not in models or (quick and k not in QUICK_PIPELINES):
            continue
        path = os.path.join(ROOT, MODELS[model][0])
        key = (model, consts)
        if key not in refs:
            tag = '%s-single-%s' % (model, '-'.join(c for c in consts if c != '-D'))
            exe, err = compile_plan(ptc, path, list(consts), work, tag.replace('=', ''))
            refs[key] = {}
            for backend in BACKENDS:
                refs[key][backend], err = (None, err) if err else run_plan(exe, backend)
                if err:
                    print('FAIL %s %s single device (%s): %s' % (model, ' '.join(consts),
                                                                 backend, err))
                    failures += 1
                    refs[key] = None
                    break
        if refs[key] is None:
            continue
        tag = '%s %s' % (model, args)
        exe, err = compile_plan(ptc, path, list(consts) + args.split(), work,
                                'pp%d-%s' % (k, model))
        for backend in BACKENDS:
            got, err = (None, err) if err else run_plan(exe, backend)
            if err:
                print('FAIL %s (%s): %s' % (tag, backend, err))
                failures += 1
                break
            wl, ww, where = compare(refs[key][backend], got)
            ok = wl < LOSS_TOL and ww < WEIGHT_TOL
            print('%s %-40s %-3s loss %.1e  weights %.1e (%s)' % (
                'ok  ' if ok else 'FAIL', tag, backend, wl, ww, where))
            sys.stdout.flush()
            passes += ok
            failures += not ok
    return passes, failures


def main():
    ptc = sys.argv[1]
    models = list(MODELS)
    for k, a in enumerate(sys.argv[2:], 2):
        if a.startswith('--models='):
            models = a.split('=', 1)[1].split(',')
        elif a == '--models' and k + 1 < len(sys.argv):
            models = sys.argv[k + 1].split(',')
    quick = '--quick' in sys.argv
    global BACKENDS, PRECISION, LOSS_TOL, WEIGHT_TOL
    if quick:
        BACKENDS = ('jit',)
    if '--precision' in sys.argv:
        PRECISION = sys.argv[sys.argv.index('--precision') + 1]
        BACKENDS = ('jit',)
        LOSS_TOL, WEIGHT_TOL = PRECISION_TOL[PRECISION]
    if '--device' in sys.argv:  # the CUDA backend: cuda, or cuda-emulated without a GPU
        BACKENDS = (sys.argv[sys.argv.index('--device') + 1],)
    failures = passes = 0
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix='ptc-equiv-') as work:
        for model, variant, extra, only in ((m, v, x, o) for m in models
                                            for v, x, o in MOE.get(m, [('', [], None)])):
            rel, max_dp, max_tp = MODELS[model]
            path = os.path.join(ROOT, rel)
            name = model + (' ' + variant if variant else '')
            single = name.replace(' ', '_').replace('.', '') + '-single'
            exe, err = compile_plan(ptc, path, extra, work, single)
            refs = {}
            for backend in BACKENDS:
                refs[backend], err = (None, err) if err else run_plan(exe, backend)
                if not err and extra and not any(refs[backend][2]):
                    err = 'the variant drops no token: %s' % refs[backend][2]
                if err:
                    print('FAIL %s single device (%s): %s' % (name, backend, err))
                    failures += 1
                    break
            if err:
                continue
            meshes = list(configs(max_dp, max_tp))
            meshes += list(ep_configs()) if model in MOE else []
            # --quick (the sanitizer run): the moe variants with a capacity, on the meshes that
            # split the experts or the stages (dp x tp alone is the other models')
            if quick and model in MOE and not any('capacity' in a for a in extra):
                continue
            for pp, dp, ep, tp, sp, zero in only or meshes:
                if quick and (sp or zero not in (0, 3)):
                    continue
                # moe on dp x tp alone: two meshes (the other models cover dp x tp; the time goes
                # to the meshes that split the experts)
                if (model in MOE and not only and ep == 1 and pp == 1 and
                        (dp, tp, sp, zero) not in ((2, 1, False, 0), (1, 2, True, 0))):
                    continue
                if quick and model in MOE and (ep == 1 and pp == 1 or zero):
                    continue
                mesh = ','.join('%s=%d' % (a, n) for a, n in
                                (('pp', pp), ('dp', dp), ('ep', ep), ('tp', tp))
                                if n > 1 or a in ('dp', 'tp'))
                args = extra + ['--mesh', mesh, '--zero', str(zero)]
                args += ['--seq-parallel'] if sp else []
                tag = '%s %s%s zero=%d' % (name, mesh.replace(',', ' '), ' sp' if sp else '',
                                           zero)
                exe, err = compile_plan(ptc, path, args, work,
                                        tag.replace(' ', '_').replace('=', '').replace('.', ''))
                for backend in BACKENDS:
                    got, err = (None, err) if err else run_plan(exe, backend)
                    if err:
                        print('FAIL %s (%s): %s' % (tag, backend, err))
                        failures += 1
                        break
                    wl, ww, where = compare(refs[backend], got, pp)
                    wtol = MOE_WEIGHT_TOL if PRECISION and model in MOE else WEIGHT_TOL
                    ok = wl < LOSS_TOL and ww < wtol
                    print('%s %-52s %-3s loss %.1e  weights %.1e (%s)' % (
                        'ok  ' if ok else 'FAIL', tag, backend, wl, ww, where))
                    sys.stdout.flush()
                    passes += ok
                    failures += not ok
        p, f = pipelines(ptc, models, quick, work)
        passes += p
        failures += f
    print('equivalence matrix: %d runs (plans x backends) in %.0f s' % (passes + failures,
                                                                      time.time() - t0))
    print('%d passed, %d failed' % (passes, failures))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
