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
    "        let m = maxr(j2 < 7: tanh(x[r * 7 + j2])) + sin(x[r * 7]) * cos(x[r * 7 + 1])\n"
    "        let id = ids[r]\n"
    "        z[r] = select(id < 3, s * c, m) + sqrt(min(max(s, 0.25), 9.0))\n"
    "        for j < 7 {\n"
    "            let v = x[r * 7 + j]\n"
    "            y[r * 7 + (6 - j)] = -v / (1.0 + float(j)) + select(j == id % 7, 1.0, 0.0)\n"
    "            w[r * 7 + j] = v * m - s\n"
    "        }\n"
    "    }\n"
    "}\n";

/* bf16 storage: loads widen, stores round, round_bf16 in between; bit-exact on every target (a
 * sum of two floats and the difference of a value and its rounding are exact in float) */
static const char kir_bf16[] =
    "kernel half(h: bf16[97], x: f32[97], o: out bf16[97], r: out f32[97], g: out bf16[97] = h) {\n"
    "    for i < 97 parallel {\n"
    "        let v = h[i] + x[i]\n"
    "        o[i] = v\n"
    "        r[i] = round_bf16(v) - v\n"
    "        g[i] = select(v < 0.0, v * 0.5, round_bf16(v))\n"
    "    }\n"
    "}\n";

/* the same over f16 (IEEE half) */
static const char kir_f16[] =
    "kernel half16(h: f16[97], x: f32[97], o: out f16[97], r: out f32[97], g: out f16[97] = h) {\n"
    "    for i < 97 parallel {\n"
    "        let v = h[i] + x[i]\n"
    "        o[i] = v\n"
    "        r[i] = round_f16(v) - v\n"
    "        g[i] = select(v < 0.0, v * 0.5, round_f16(v))\n"
    "    }\n"
    "}\n";

#endif
