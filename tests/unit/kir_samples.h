/* kir_samples.h - kernels of the kernel IR shared by the tests of its targets (test_fuse: LLVM;
 * test_cuda: CUDA C). */
#ifndef PTC_TEST_KIR_SAMPLES_H
#define PTC_TEST_KIR_SAMPLES_H

/* every expression kind, a row with loops and reductions, an output written over an input */
static const char kir_every_kind[] =
    "kernel every(x: f32[91], ids: i32[13], y: out f32[91], z: out f32[13], w: out f32[91] = x) {\n"
    "    let c = float(13 % 5) / 3.0\n"
    "    for r < 13 parallel {\n"
    "        let s = sum(j < 7: exp(x[r * 7 + j] * 0.5) - log(1.5 + x[r * 7 + j] * x[r * 7 + j]))\n"
    "        let m = maxr(j2 < 7: tanh(x[r * 7 + j2]))\n"
    "        let id = ids[r]\n"
    "        z[r] = select(id < 3, s * c, m) + sqrt(min(max(s, 0.25), 9.0))\n"
    "        for j < 7 {\n"
    "            let v = x[r * 7 + j]\n"
    "            y[r * 7 + (6 - j)] = -v / (1.0 + float(j)) + select(j == id % 7, 1.0, 0.0)\n"
    "            w[r * 7 + j] = v * m - s\n"
    "        }\n"
    "    }\n"
    "}\n";

#endif
