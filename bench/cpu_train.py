#!/usr/bin/python3
"""ptc against PyTorch: training throughput of the same GPT on the same CPU, in one run.

For each model (gpt2_tiny, GPT-2s made from examples/gpt2.ptm with -D overrides, and moe_small,
a small Mixtral from examples/moe.ptm) it writes one set of initial weights and one token file,
then trains
  - ptc: the executable `ptc MODEL.ptm -o EXE` writes, on the fast CPU backend, and
  - PyTorch: the same model written with torch.nn.functional (fused layer_norm, tanh GELU,
    cross_entropy; attention as matmul, causal mask, softmax, matmul, as torch 1.13 has no fused
    CPU attention; under PyTorch 2, run from a venv's python, scaled_dot_product_attention and
    AdamW(fused=True), its fastest eager CPU setting), weights in nn.Linear's [out, in] layout
    (moe_small: TorchMoE below, whose experts are Hugging Face's Mixtral block),
from those weights on those batches with the same AdamW (the model's optimizer line, weight decay
on matrices only), a constant learning rate and gradient clipping at 1.0. The first --warmup steps
are not timed. It prints one table (tokens/s of each and the ratio ptc/torch), the loss of the
first step on each side (the same weights and batch: they must agree, which shows that both
train the same model), and writes the results with the machine, date, commit and command to
bench/results/cpu_train_<date>.md.

    /usr/bin/python3 bench/cpu_train.py [--ptc build/tools/ptc] [--threads 2] [--repeat 1]
        [--models gpt2_tiny,gpt2_20m] [--steps N] [--warmup N] [--out bench/results]
        [--baseline OTHER_BUILD/tools/ptc]

With --baseline, a second ptc (an older build) compiles the same model and trains it in the same
run, alternating with the others, so a change is measured against what came before it on the
same machine at the same time (column "base tok/s" and the ratio ptc/base).

With --matmul-precision high or medium, both sides run their f32 GEMMs at that float32 matmul
precision: ptc's executables with --matmul-precision, PyTorch under
torch.set_float32_matmul_precision (on a CPU, PyTorch 2's medium is oneDNN's bf16 GEMMs, its high
f32 ones). The results say which ran (default: highest, f32 on both).

With --mkl-intel-path, PyTorch's GEMMs run on MKL's Intel code path on a CPU of another vendor
(MKL_SHIM_ENV below); the results say which path ran.

It never fails on timing: the exit status is 1 only when a program fails to run.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "torch"))
# PyTorch's OpenMP threads spin-wait with PAUSE by default; in a virtual machine a pause loop traps
# to the hypervisor, and on the 2-vCPU VM this was written on that made PyTorch's steps 2 to 25
# times slower (gpt2_tiny at 2 threads: 363 ms a step against 36 ms passive and 14 ms at 1 thread).
# Passive waiting is PyTorch's best setting there, so it is the default here (set before torch
# loads libgomp; an OMP_WAIT_POLICY in the environment wins). ptc's GEMMs (oneDNN, which is built
# on OpenMP) run one OpenMP thread per ptc thread, so no OpenMP team waits.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# MKL (PyTorch's f32 GEMMs on x86) picks its code path by CPU vendor: on an AMD CPU it takes a
# generic one, 1.6-2.2x slower on the issue-16 shapes on a Zen 5 with AVX-512 (2026-12-02: 109-174
# GFLOP/s at 2 threads against 235-357 on its Intel path). With --mkl-intel-path the PyTorch side
# runs on MKL's Intel path, by interposing the function MKL asks (mkl_serv_intel_cpu_true, which
# PyTorch's libtorch_cpu exports) through LD_PRELOAD: the strongest peer such a machine has. The
# script builds the shim, runs itself again with it loaded, and keeps it out of ptc's processes.
MKL_SHIM_ENV = "PTC_BENCH_MKL_SHIM"


def mkl_intel_path():
    pre = [x for x in os.environ.get("LD_PRELOAD", "").split(":") if x]
    if os.environ.get(MKL_SHIM_ENV):
        # loaded into this process; ptc's executables (which have no MKL) run without it
        pre = [x for x in pre if x != os.environ[MKL_SHIM_ENV]]
        if pre:
            os.environ["LD_PRELOAD"] = ":".join(pre)
        else:
            os.environ.pop("LD_PRELOAD", None)
        return
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ptc")
    os.makedirs(cache, exist_ok=True)
    shim = os.path.join(cache, "mkl_intel_path.so")
    src = shim[:-3] + ".c"
    with open(src, "w") as f:
        f.write("int mkl_serv_intel_cpu_true(void) { return 1; }\n")
    p = subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", shim, src],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"cpu_train.py: --mkl-intel-path: cannot build {shim}: {p.stderr.strip()}")
    os.environ[MKL_SHIM_ENV] = shim
    os.environ["LD_PRELOAD"] = ":".join([shim] + pre)
    os.execv(sys.executable, [sys.executable] + sys.argv)


if "--mkl-intel-path" in sys.argv[1:]:
    mkl_intel_path()

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from compare import (GPT2, MoE, batch_at, op_attr, parse_consts, parse_optimizer, run,
                         save_safetensors, write_tokens)
except ImportError as e:
    sys.exit(f"cpu_train.py: cannot import torch/numpy ({e}); run it with /usr/bin/python3")

# name: (.ptm file, -D overrides, timed steps, warm-up steps)
MODELS = {
    "gpt2_tiny": ("examples/gpt2_tiny.ptm", {}, 60, 10),
    # 20,088,320 parameters: 5 layers of width 512 (8 heads of 64), 8192-token vocabulary tied
    # to the head, context 256; a batch of 8 sequences of 256 tokens
    "gpt2_20m": ("examples/gpt2.ptm", {"vocab": 8192, "ctx": 256, "d": 512, "heads": 8,
                                       "layers": 5, "batch": 8, "seq": 256}, 5, 2),
    # the two configurations of the codegen issue (16): (a) small and wide-vocabulary, (b) wider
    "issue16_a": ("examples/gpt2.ptm", {"vocab": 4096, "ctx": 128, "d": 256, "heads": 4,
                                        "layers": 4, "batch": 8, "seq": 128}, 20, 3),
    "issue16_b": ("examples/gpt2.ptm", {"vocab": 8192, "ctx": 256, "d": 768, "heads": 12,
                                        "layers": 2, "batch": 4, "seq": 256}, 8, 2),
    # a small Mixtral (examples/moe.ptm): 2 layers of 8 SwiGLU experts, top 2, dropless
    "moe_small": ("examples/moe.ptm", {"vocab": 4096, "d": 256, "heads": 4, "kv_heads": 2,
                                       "n_layers": 2, "experts": 8, "top_k": 2, "ffn": 512,
                                       "batch": 8, "seq": 128}, 8, 2),
}
# PyTorch 2 (run this script with a venv's python that has it): its fastest eager CPU setting,
# scaled_dot_product_attention and AdamW(fused=True); torch 1.13 has neither
TORCH2 = hasattr(F, "scaled_dot_product_attention")


def initial_weights(params, seed):
    """GPT-2's initialisation: matrices N(0, 0.02), norm gains 1, biases 0."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape, kind in params:
        if kind == "matrix":
            w = 0.02 * torch.randn(shape, generator=gen)
        else:
            w = torch.ones(shape) if kind == "gain" else torch.zeros(shape)
        out[name] = w.to(torch.float32).numpy()
    return out


# ---------------------------------------------------------------------------------------------
# The PyTorch side
# ---------------------------------------------------------------------------------------------

class TorchGPT2:
    """examples/gpt2*.ptm written the usual PyTorch way (nanoGPT's model with its fused ops)."""

    def __init__(self, model, init, eps):
        self.m, self.eps = model, eps
        self.P = {}
        for name, _, _ in model.params():
            w = torch.tensor(init[name])  # a copy: the optimizer must not train `init`
            if w.dim() == 2 and name not in ("wte", "wpe"):
                w = w.t()  # ptc's x @ w [in, out] is F.linear's x @ W.T with W [out, in]
            self.P[name] = torch.nn.Parameter(w.contiguous())
        T = model.seq
        self.future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)

    def loss(self, tokens, targets):
        m, P, d, H = self.m, self.P, self.m.d, self.m.heads
        B, T = tokens.shape
        x = F.embedding(tokens, P["wte"]) + P["wpe"][:T]
        for i in range(m.layers):
            h = f"h.{i}."
            a = F.layer_norm(x, (d,), P[h + "ln_1.g"], P[h + "ln_1.b"], self.eps)
            q, k, v = F.linear(a, P[h + "attn.w_qkv"], P[h + "attn.b_qkv"]).split(d, dim=2)
            q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
            if TORCH2:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / (d // H) ** 0.5)
                att = F.softmax(att.masked_fill(self.future, float("-inf")), dim=-1)
                y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, d)
            x = x + F.linear(y, P[h + "attn.w_o"], P[h + "attn.b_o"])
            a = F.layer_norm(x, (d,), P[h + "ln_2.g"], P[h + "ln_2.b"], self.eps)
            a = F.gelu(F.linear(a, P[h + "mlp.w_fc"], P[h + "mlp.b_fc"]), approximate="tanh")
            x = x + F.linear(a, P[h + "mlp.w_proj"], P[h + "mlp.b_proj"])
        x = F.layer_norm(x, (d,), P["ln_f.g"], P["ln_f.b"], self.eps)
        logits = F.linear(x, P["wte"])  # the head tied to the token embedding
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class TorchMoE:
    """examples/moe*.ptm (dropless) written the usual PyTorch way: Llama blocks with F.rms_norm
    and scaled_dot_product_attention over grouped heads (enable_gqa), rope with Meta's pairing
    of adjacent elements as the language has it, and the experts as Hugging Face's Mixtral
    writes them (MixtralSparseMoeBlock: softmax router, top-k, weights renormalised, a loop over
    the experts, each gathering its tokens, two products and index_add_ into the output), plus
    Switch Transformer's load-balancing loss, as the .ptm adds it."""

    def __init__(self, model, init, eps):
        if model.capacity:
            raise ValueError("TorchMoE is dropless: the model's capacity_factor must be 0")
        self.m, self.eps = model, eps
        self.P = {name: torch.nn.Parameter(torch.tensor(init[name]).contiguous())
                  for name, _, _ in model.params()}
        dh = model.head_dim
        j = torch.arange(dh // 2, dtype=torch.float64)
        angle = torch.arange(model.seq, dtype=torch.float64)[:, None] * \
            model.base ** (-2.0 * j / dh)[None, :]
        self.cos = torch.cos(angle).float()[None, :, None, :]
        self.sin = torch.sin(angle).float()[None, :, None, :]
        self.act = {"swiglu": None, "silu": F.silu, "relu": F.relu,
                    "gelu": lambda h: F.gelu(h, approximate="tanh")}[model.act]

    def norm(self, x, g):
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (x.shape[-1],), g, self.eps)
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * g

    def rope(self, x, heads):
        B, S, D = x.shape
        x0, x1 = x.view(B, S, heads, D // heads // 2, 2).unbind(-1)
        c, s = self.cos[:, :S], self.sin[:, :S]
        return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).reshape(B, S, D)

    def experts(self, x, h):
        m, P = self.m, self.P
        B, S, d = x.shape
        xf = x.reshape(-1, d)
        p = torch.softmax(xf @ P[h + "router"], dim=-1)
        weight, chosen = torch.topk(p, m.top_k, dim=-1)
        if m.normalize:
            weight = weight / weight.sum(dim=-1, keepdim=True)
        y = torch.zeros_like(xf)
        mask = F.one_hot(chosen, m.experts).permute(2, 1, 0)  # [E, top_k, tokens]
        for e in range(m.experts):
            j, t = torch.where(mask[e])
            if t.numel() == 0:
                continue
            hid = xf[t] @ P[h + "w_up"][e]
            if self.act is None:
                f = hid.shape[-1] // 2
                a = F.silu(hid[:, :f]) * hid[:, f:]
            else:
                a = self.act(hid)
            y.index_add_(0, t, (a @ P[h + "w_down"][e]) * weight[t, j, None])
        frac = torch.bincount(chosen.reshape(-1), minlength=m.experts).float() / chosen.numel()
        return y.view(B, S, d), m.experts * (frac * p.mean(0)).sum()

    def loss(self, tokens, targets):
        m, P = self.m, self.P
        B, S = tokens.shape
        H, G, dh = m.heads, m.kv_heads, m.head_dim
        x = F.embedding(tokens, P["tok_embeddings"])
        aux = 0
        for i in range(m.layers):
            h = f"layers.{i}."
            a = self.norm(x, P[h + "attention_norm.g"])
            q = self.rope(a @ P[h + "attention.wq"], H).view(B, S, H, dh).transpose(1, 2)
            k = self.rope(a @ P[h + "attention.wk"], G).view(B, S, G, dh).transpose(1, 2)
            v = (a @ P[h + "attention.wv"]).view(B, S, G, dh).transpose(1, 2)
            if TORCH2:
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=G != H)
            else:
                k, v = k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1)
                att = (q @ k.transpose(-2, -1)) * dh ** -0.5
                future = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
                o = F.softmax(att.masked_fill(future, float("-inf")), dim=-1) @ v
            x = x + o.transpose(1, 2).reshape(B, S, H * dh) @ P[h + "attention.wo"]
            y, aux_i = self.experts(self.norm(x, P[h + "ffn_norm.g"]), h)
            x, aux = x + y, aux + aux_i
        logits = self.norm(x, P["norm.g"]) @ P["lm_head"]
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1)) + \
            m.aux_weight * aux


# PyTorch's GEMMs on the CPU: the linear layers forward (addmm; the tied head mm) and every
# product of their backward (mm). scaled_dot_product_attention's products run inside its own op,
# as ptc's run inside its attention kernels, so neither side counts them.
TORCH_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def train_torch(model, init, eps, opt, tokens, steps, warmup, compiled=False, profile=False):
    """Returns (timed seconds, losses of every step). compiled: the loss (forward, and through
    AOTAutograd its backward) under torch.compile (Inductor's C++/OpenMP kernels on the CPU),
    compiled in the warm-up steps. profile: the timed steps under torch.profiler, and instead of
    the seconds, PyTorch's GEMM milliseconds per step (the self time of TORCH_GEMMS)."""
    net = (TorchMoE if isinstance(model, MoE) else TorchGPT2)(model, init, eps)
    loss_fn = torch.compile(net.loss) if compiled else net.loss
    decay = [p for n, p in net.P.items() if p.dim() >= 2]
    no_decay = [p for n, p in net.P.items() if p.dim() < 2]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": opt["weight_decay"]},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"],
                              **({"fused": True} if TORCH2 else {"foreach": True}))
    params = list(net.P.values())
    losses = []

    def step(k):
        x, y = batch_at(tokens, k, model.batch, model.seq)
        optim.zero_grad(set_to_none=True)
        loss = loss_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optim.step()
        losses.append(loss.item())

    for k in range(warmup):
        step(k)
    if profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for k in range(warmup, warmup + steps):
                step(k)
        us = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in TORCH_GEMMS)
        return us / 1e3 / steps, losses
    t0 = time.perf_counter()
    for k in range(warmup, warmup + steps):
        step(k)
    return time.perf_counter() - t0, losses


# ---------------------------------------------------------------------------------------------
# The ptc side
# ---------------------------------------------------------------------------------------------

MATMUL = "highest"  # --matmul-precision: both sides' float32 matmul precision


def precision_flags():
    return [] if MATMUL == "highest" else ["--matmul-precision", MATMUL]


def train_ptc(exe, wd, steps, warmup, threads, lr):
    """Returns (timed seconds from the log's step_ms, losses of every step)."""
    log = os.path.join(wd, "ptc.jsonl")
    run([exe, "--init-from", os.path.join(wd, "init.safetensors"),
         "--data", os.path.join(wd, "data.bin"), "--steps", str(warmup + steps),
         "--lr", repr(lr), "--schedule", "constant", "--grad-clip", "1", "--threads",
         str(threads), "--log", log, "--quiet"] + precision_flags(), "the compiled model")
    recs = [json.loads(line) for line in open(log)]
    recs = sorted((r for r in recs if "loss" in r), key=lambda r: r["step"])
    timed = [r["step_ms"] for r in recs if r["step"] > warmup]
    return sum(timed) / 1e3, [r["loss"] for r in recs]


def profile_ptc(exe, wd, steps, warmup, threads, lr):
    """ptc's --profile of the same run: (GEMM ms per step, all instructions' ms per step, GEMM
    GFLOP per step)."""
    p = subprocess.run([exe, "--init-from", os.path.join(wd, "init.safetensors"),
                        "--data", os.path.join(wd, "data.bin"), "--steps", str(warmup + steps),
                        "--lr", repr(lr), "--schedule", "constant", "--grad-clip", "1",
                        "--threads", str(threads), "--profile", "--quiet"] + precision_flags(),
                       capture_output=True, text=True)
    gemm = total = gflop = None
    for line in (p.stdout + p.stderr).splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "matmul":
            gemm = float(f[2])
            gflop = float(f[4]) if len(f) >= 6 else None
        elif len(f) >= 3 and f[0] == "total":
            total = float(f[1])
    return gemm, total, gflop


def fma_peak(exe, threads):
    """bench/fma_peak's f32 FLOP rate of the FMA units at `threads` threads (GFLOP/s), or None
    where it is not built (it is an x86 program)."""
    if not exe or not os.access(exe, os.X_OK):
        return None
    p = subprocess.run([exe, "--threads", str(threads), "--json"], capture_output=True, text=True)
    try:
        return json.loads(p.stdout)["gflops"] if p.returncode == 0 else None
    except (ValueError, KeyError):
        return None


# ---------------------------------------------------------------------------------------------

def machine():
    # the model name, and what tells machines apart where it does not ("AMD EPYC", "Intel(R)
    # Xeon(R) Processor" in a VM): family and model, and the widest vector instructions
    cpu, info = "?", {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
            if not line.strip():
                break
    except OSError:
        pass
    if info:
        flags = info.get("flags", "").split()
        isa = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE") + \
              (" AMX" if "amx_tile" in flags else "")
        cpu = "%s (family %s, model %s; %s)" % (info.get("model name", "?"),
                                                 info.get("cpu family", "?"),
                                                 info.get("model", "?"), isa)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    blas = subprocess.run(["sh", "-c", "dpkg-query -W -f '${Version}' libopenblas0-pthread"],
                          capture_output=True, text=True).stdout.strip() or "?"
    return {"uname": " ".join(platform.uname()), "nproc": os.cpu_count(), "cpu": cpu,
            "openblas": blas, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
            "commit": commit + (" (with uncommitted changes)" if dirty else ""),
            "torch": torch.__version__, "python": platform.python_version(),
            "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "mkl_path": ("Intel code path, forced (--mkl-intel-path: mkl_serv_intel_cpu_true "
                         "interposed)" if os.environ.get(MKL_SHIM_ENV) else
                         "its own choice of code path" +
                         ("" if info.get("vendor_id", "GenuineIntel") == "GenuineIntel" else
                          " (not Intel's on this CPU; --mkl-intel-path runs the stronger peer)"))}


def bench_model(name, args, wd):
    path, defines, steps, warmup = MODELS[name]
    steps, warmup = args.steps or steps, args.warmup if args.warmup is not None else warmup
    path = os.path.join(ROOT, path)
    text = open(path).read()
    consts = parse_consts(text, defines)
    opt = parse_optimizer(text)
    moe = "moe" in os.path.basename(path)
    model = (MoE if moe else GPT2)(text, consts)
    params = model.params()
    nparams = sum(int(np.prod(s)) for _, s, _ in params)
    B, T = model.batch, model.seq

    init = initial_weights(params, 1234)
    rng = np.random.default_rng(1234)
    tokens = rng.integers(0, model.vocab, size=(warmup + steps) * B * T + 1).astype(np.uint16)
    save_safetensors(os.path.join(wd, "init.safetensors"), init)
    write_tokens(os.path.join(wd, "data.bin"), tokens)
    exe = os.path.join(wd, "exe")
    dflags = [x for k, v in defines.items() for x in ("-D", f"{k}={v}")]
    run([args.ptc] + dflags + [path, "-o", exe], "ptc")
    base_exe = os.path.join(wd, "exe_base")
    if args.baseline:
        run([args.baseline] + dflags + [path, "-o", base_exe], "the baseline ptc")

    eps = model.eps if moe else op_attr(text, "layernorm", "eps", 1e-5)
    ptc_s, torch_s, base_s, ptc_loss, torch_loss, base_loss = [], [], [], None, None, None
    comp_s, comp_loss = [], None
    for _ in range(args.repeat):  # alternate, so a change in the machine's load hits all
        s, ptc_loss = train_ptc(exe, wd, steps, warmup, args.threads, opt["lr"])
        ptc_s.append(s)
        if args.baseline:
            s, base_loss = train_ptc(base_exe, wd, steps, warmup, args.threads, opt["lr"])
            base_s.append(s)
        s, torch_loss = train_torch(model, init, eps, opt, tokens, steps, warmup)
        torch_s.append(s)
        if args.torch_compile:
            s, comp_loss = train_torch(model, init, eps, opt, tokens, steps, warmup, True)
            comp_s.append(s)
    # the GEMM ceiling: tokens per second if everything but ptc's GEMMs took no time. PyTorch
    # runs the same GEMMs on MKL (its own GEMM time is measured below, beside ptc's), so no system
    # on these GEMM libraries passes it; ceiling / torch bounds ptc / torch
    gemm_ms, total_ms, gemm_gflop = profile_ptc(exe, wd, steps, warmup, args.threads, opt["lr"])
    if moe:  # (the experts' GEMMs run inside ptc's moe kernels, which the matmul row leaves out)
        gemm_ms = gemm_gflop = None
    # PyTorch's own GEMM time, under its profiler (a separate run; the timed runs are unprofiled)
    torch_gemm_ms = None
    if hasattr(torch, "profiler"):
        torch_gemm_ms, _ = train_torch(model, init, eps, opt, tokens, steps, warmup, profile=True)
    # the hardware's bound: the same GEMM FLOPs at the FMA units' peak (bench/fma_peak, measured
    # now) and every other op free; no f32 implementation of this step on this machine passes it
    # (attention's products, run outside the GEMM instructions, are not even counted)
    peak = fma_peak(args.fma_peak, args.threads) if MATMUL == "highest" else None
    ptc_tps = steps * B * T / statistics.median(ptc_s)
    torch_tps = steps * B * T / statistics.median(torch_s)
    base_tps = steps * B * T / statistics.median(base_s) if base_s else None
    comp_tps = steps * B * T / statistics.median(comp_s) if comp_s else None
    return {"model": name, "file": os.path.relpath(path, ROOT), "defines": dflags,
            "params": nparams, "batch": B, "seq": T, "steps": steps, "warmup": warmup,
            "ptc_tok_s": ptc_tps, "torch_tok_s": torch_tps, "ratio": ptc_tps / torch_tps,
            "base_tok_s": base_tps, "base_ratio": ptc_tps / base_tps if base_tps else None,
            "ptc_s": ptc_s, "torch_s": torch_s, "base_s": base_s,
            "loss1": (ptc_loss[0], torch_loss[0]), "loss_last": (ptc_loss[-1], torch_loss[-1]),
            "base_loss1": base_loss[0] if base_loss else None,
            "compile_tok_s": comp_tps, "compile_ratio": ptc_tps / comp_tps if comp_tps else None,
            "compile_s": comp_s, "compile_loss1": comp_loss[0] if comp_loss else None,
            "gemm_ms": gemm_ms, "profile_ms": total_ms,
            "ceiling_tok_s": B * T / (gemm_ms / 1e3) if gemm_ms else None,
            "ceiling_ratio": B * T / (gemm_ms / 1e3) / torch_tps if gemm_ms else None,
            "gemm_gflop": gemm_gflop, "fma_peak_gflops": peak, "torch_gemm_ms": torch_gemm_ms,
            "bound_tok_s": B * T * peak / gemm_gflop if peak and gemm_gflop else None,
            "bound_ratio": B * T * peak / gemm_gflop / torch_tps if peak and gemm_gflop
            else None}


def table(rows):
    base = any(r["base_tok_s"] for r in rows)
    comp = any(r.get("compile_tok_s") for r in rows)
    head = (f"{'model':<10} {'params':>11} {'batch x seq':>11} {'ptc tok/s':>10} "
            f"{'torch tok/s':>11} {'ptc/torch':>9}" +
            (f" {'compile tok/s':>13} {'ptc/compile':>11}" if comp else "") +
            (f" {'base tok/s':>10} {'ptc/base':>8}" if base else "") +
            f" {'GEMM-only tok/s':>15} {'that/torch':>10}" +
            f" {'FMA-peak tok/s':>14} {'that/torch':>10}" +
            f"  {'loss step 1 ptc / torch':<25}")
    lines = [head, "-" * len(head)]
    for r in rows:
        extra = (f" {r['compile_tok_s']:>13.0f} {r['compile_ratio']:>11.2f}" if comp else "") + \
            (f" {r['base_tok_s']:>10.0f} {r['base_ratio']:>8.2f}" if base else "")
        ceil = (f" {r['ceiling_tok_s']:>15.0f} {r['ceiling_ratio']:>10.2f}"
                if r.get("ceiling_tok_s") else f" {'-':>15} {'-':>10}")
        ceil += (f" {r['bound_tok_s']:>14.0f} {r['bound_ratio']:>10.2f}"
                 if r.get("bound_tok_s") else f" {'-':>14} {'-':>10}")
        lines.append(f"{r['model']:<10} {r['params']:>11,} {r['batch']:>5} x {r['seq']:<5}"
                     f"{r['ptc_tok_s']:>10.0f} {r['torch_tok_s']:>11.0f} {r['ratio']:>9.2f}"
                     f"{extra}{ceil}  {r['loss1'][0]:.6f} / {r['loss1'][1]:.6f}")
    return "\n".join(lines)


def gemm_lines(rows):
    """Per model: the GEMMs of a step on each side, where measured."""
    out = []
    for r in rows:
        if not r.get("gemm_ms"):
            continue
        line = (f"{r['model']}: GEMMs a step, ptc {r['gemm_ms']:.1f} ms (--profile; "
                f"{r['profile_ms']:.1f} ms of instructions in all)")
        if r.get("gemm_gflop"):
            line += f", {r['gemm_gflop']:.2f} GFLOP"
        if r.get("torch_gemm_ms"):
            tstep = r["batch"] * r["seq"] / r["torch_tok_s"] * 1e3
            line += (f"; PyTorch {r['torch_gemm_ms']:.1f} ms of a {tstep:.1f} ms step "
                     f"(torch.profiler, self time of {', '.join(TORCH_GEMMS)})")
        out.append(line)
    return out


def write_results(out_dir, rows, info, command, args):
    os.makedirs(out_dir, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    path = os.path.join(out_dir, f"cpu_train_{stamp}.md")
    with open(path, "w") as f:
        f.write(f"# cpu_train: ptc vs PyTorch, {stamp}\n\n")
        f.write(f"    {command}\n\n")
        f.write(f"- machine: `{info['uname']}`\n- CPU: {info['cpu']}, nproc {info['nproc']}; "
                f"threads: ptc {args.threads}, PyTorch {args.torch_threads} "
                f"(OMP_WAIT_POLICY={info['omp_wait_policy']})\n"
                f"- load average at the end (1, 5, 15 min): {info['load']}\n"
                f"- float32 matmul precision: {args.matmul_precision} (both sides)\n"
                f"- PyTorch's MKL: {info['mkl_path']}\n"
                f"- commit: {info['commit']}\n- PyTorch {info['torch']}, Python "
                f"{info['python']}, OpenBLAS {info['openblas']}\n")
        peaks = sorted({r["fma_peak_gflops"] for r in rows if r.get("fma_peak_gflops")})
        f.write("- GEMM-only: ptc's GEMM instructions at the rate they ran (its --profile), every "
                "other op free. FMA-peak: the same GEMM FLOPs at the rate of the FMA units "
                "(bench/fma_peak at the same threads: " +
                (", ".join(f"{x:.1f}" for x in peaks) + " GFLOP/s" if peaks else "not run") +
                "), every other op free: no f32 step on this machine is faster\n\n")
        f.write("```\n" + table(rows) + "\n```\n\n")
        for line in gemm_lines(rows):
            f.write(f"- {line}\n")
        f.write("\n")
        for r in rows:
            cmd = " ".join([r["file"]] + r["defines"])
            f.write(f"- {r['model']}: `{cmd}`, {r['steps']} timed "
                    f"steps after {r['warmup']} warm-up; seconds per run ptc {r['ptc_s']}, torch "
                    f"{r['torch_s']}" + (f", torch.compile {r['compile_s']} (loss step 1 "
                                         f"{r['compile_loss1']:.6f})" if r.get('compile_s') else "")
                    + (f", baseline {r['base_s']} (loss step 1 "
                                         f"{r['base_loss1']:.6f})" if r['base_s'] else "") +
                    f"; loss after the last step ptc {r['loss_last'][0]:.6f}, "
                    f"torch {r['loss_last'][1]:.6f}\n")
        f.write("\n```json\n" + json.dumps({"machine": info, "command": command, "results": rows},
                                           indent=1) + "\n```\n")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ptc", default=os.path.join(ROOT, "build", "tools", "ptc"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads for ptc and PyTorch (default: every CPU)")
    ap.add_argument("--torch-threads", type=int,
                    help="PyTorch's threads when they should differ from --threads")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: " +
                    ", ".join(MODELS))
    ap.add_argument("--steps", type=int, help="timed steps (default: per model)")
    ap.add_argument("--warmup", type=int, help="untimed steps first (default: per model)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each side this many times, alternating; the median counts")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--torch-compile", action="store_true",
                    help="also train the PyTorch model under torch.compile (PyTorch 2)")
    ap.add_argument("--baseline", help="another build's ptc, run side by side (e.g. an older "
                    "commit's build/tools/ptc)")
    ap.add_argument("--fma-peak", default=os.path.join(ROOT, "build", "bench", "fma_peak"),
                    help="bench/fma_peak, built with the project, for the FMA-peak bound")
    ap.add_argument("--matmul-precision", default="highest", choices=["highest", "high", "medium"],
                    help="both sides' float32 matmul precision (default highest: f32)")
    ap.add_argument("--mkl-intel-path", action="store_true",
                    help="run PyTorch's MKL GEMMs on MKL's Intel code path on a non-Intel CPU "
                    "(an LD_PRELOAD shim; see MKL_SHIM_ENV)")
    args = ap.parse_args()
    global MATMUL
    MATMUL = args.matmul_precision
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision(MATMUL)
    elif MATMUL != "highest":
        ap.error("--matmul-precision needs PyTorch's set_float32_matmul_precision (1.12 on)")
    for m in args.models.split(","):
        if m not in MODELS:
            ap.error(f"unknown model {m} (known: {', '.join(MODELS)})")
    for exe in [args.ptc] + ([args.baseline] if args.baseline else []):
        if not os.access(exe, os.X_OK):
            ap.error(f"{exe} is not an executable: build first (cmake --build build)")
    args.torch_threads = args.torch_threads or args.threads
    torch.set_num_threads(args.torch_threads)
    if args.torch_compile and not hasattr(torch, "compile"):
        ap.error("--torch-compile needs PyTorch 2 (run this script with a venv's python)")
    command = sys.executable + " " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
    rows = []
    with tempfile.TemporaryDirectory(prefix="ptc-bench-") as wd:
        for m in args.models.split(","):
            rows.append(bench_model(m, args, wd))
            print(f"{m}: ptc {rows[-1]['ptc_tok_s']:.0f} tok/s, torch "
                  f"{rows[-1]['torch_tok_s']:.0f} tok/s", flush=True)
    print()
    print(table(rows))
    for line in gemm_lines(rows):
        print(line)
    path = write_results(args.out, rows, machine(), command, args)
    print(f"\nresults: {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
