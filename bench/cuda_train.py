#!/usr/bin/env python3
"""GPT-2 training on one GPU: ptc's CUDA backend against PyTorch on the same machine, in one run
(issue 15's measurement). Prepared on machines without a GPU; run it where one is lent.

Default: GPT-2 124M (examples/gpt2.ptm: 12 layers of 768, vocabulary 50304), batch 16 x 1024,
bf16, AdamW. ptc: `ptc --precision bf16 -o g`, then `g --device cuda --steps N --peak-flops P`
(tok/s and MFU from its summary line). PyTorch, where `torch.cuda.is_available()`: the same model
(bench/cpu_train.py's TorchGPT2, nanoGPT's layout) under `torch.autocast(bfloat16)` with
scaled_dot_product_attention and AdamW(fused=True), timed with CUDA syncs. MFU counts model
FLOPs as PaLM does (6N per token plus attention) over --peak-flops (default: an H100 SXM's dense
bf16, 989 TFLOP/s). Results go to bench/results/cuda_train_<date>.md with the device, date,
commit and command.

    python3 bench/cuda_train.py                         # on a GPU machine
    python3 bench/cuda_train.py --device cuda-emulated --model tiny --steps 2 --warmup 1 \\
        --no-torch                                      # a smoke run of this script, no GPU
    python3 bench/cuda_train.py --baseline old/ptc --rounds 3   # a change, side by side
"""
import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "124m": ("examples/gpt2.ptm", {"batch": 16, "seq": 1024}),
    "tiny": ("examples/gpt2_tiny.ptm", {"batch": 2, "seq": 8}),
}


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def device_name():
    p = sh(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]) \
        if shutil_which("nvidia-smi") else None
    return p.stdout.strip().splitlines()[0] if p and p.returncode == 0 and p.stdout else "no GPU"


def shutil_which(x):
    from shutil import which
    return which(x)


def run_ptc(args, wd, ptc=None, name="g"):
    model, defs = CONFIGS[args.model]
    exe = os.path.join(wd, name)
    cmd = [ptc or args.ptc, os.path.join(ROOT, model), "-o", exe, "--precision", args.precision]
    for k, v in defs.items():
        cmd += ["-D", f"{k}={v}"]
    b = sh(cmd)
    if b.returncode:
        sys.exit(f"ptc failed: {b.stderr.strip()}")
    steps = args.steps + args.warmup
    run = [exe, "--device", args.device, "--steps", str(steps), "--peak-flops",
           str(args.peak_flops)]
    if args.matmul_precision != "highest":
        run += ["--matmul-precision", args.matmul_precision]
    t0 = time.time()
    p = sh(run, cwd=wd)
    wall = time.time() - t0
    if p.returncode:
        sys.exit(f"the ptc run failed ({' '.join(run)}): {p.stderr.strip()}")
    lines = re.findall(r"step +(\d+)/\d+ \| loss (\S+) .*?\| (\d+) tok/s \| MFU ([0-9.]+)% \| ([0-9.]+) ms",
                       p.stdout)
    timed = [l for l in lines if int(l[0]) > args.warmup]
    ms = sorted(float(l[4]) for l in timed)
    med = ms[len(ms) // 2] if ms else float("nan")
    tokens = defs["batch"] * defs["seq"]
    return {"cmd": " ".join(cmd) + " && " + " ".join(run), "loss1": float(lines[0][1]) if lines else None,
            "ms": med, "tok_s": tokens / (med / 1e3) if ms else 0.0,
            "mfu": sorted(float(l[3]) for l in timed)[len(timed) // 2] if timed else 0.0,
            "wall": wall, "tokens": tokens}


def run_torch(args):
    try:
        import torch
        if args.torch_device == "cuda" and not torch.cuda.is_available():
            return None, "torch has no CUDA device here"
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        import cpu_train  # noqa: E402  (its TorchGPT2 and GPT-2 initialisation)
    except ImportError as e:
        return None, f"no torch ({e})"
    model, defs = CONFIGS[args.model]
    text = open(os.path.join(ROOT, model)).read()
    m = cpu_train.GPT2(text, cpu_train.parse_consts(text, defs))
    init = cpu_train.initial_weights(m.params(), 1)
    tm = cpu_train.TorchGPT2(m, init, 1e-5)
    dev = torch.device(args.torch_device)
    torch.set_float32_matmul_precision(args.matmul_precision)
    sync = torch.cuda.synchronize if args.torch_device == "cuda" else (lambda: None)
    for k in tm.P:
        tm.P[k] = torch.nn.Parameter(tm.P[k].detach().to(dev))
    tm.future = tm.future.to(dev)
    opt = torch.optim.AdamW(tm.P.values(), lr=1e-4, fused=True)
    B, T = defs["batch"], defs["seq"]
    tokens = torch.randint(0, m.vocab, (B, T + 1), device=dev)
    times = []
    for s in range(args.steps + args.warmup):
        sync()
        t0 = time.time()
        with torch.autocast(args.torch_device, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = tm.loss(tokens[:, :T].contiguous(), tokens[:, 1:].contiguous())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if s >= args.warmup:
            times.append(time.time() - t0)
    times.sort()
    med = times[len(times) // 2]
    return {"ms": 1e3 * med, "tok_s": B * T / med, "torch": torch.__version__}, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ptc", default=os.path.join(ROOT, "build", "tools", "ptc"))
    ap.add_argument("--model", choices=sorted(CONFIGS), default="124m")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--matmul-precision", choices=["highest", "high", "medium"], default="highest",
                    help="both sides' float32 matmul precision (fp32: high is TF32 on a GPU)")
    ap.add_argument("--device", default="cuda", help="cuda, or cuda-emulated for a smoke run")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-flops", type=float, default=989.4e12)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--torch-device", default="cuda", help="cpu: the PyTorch side on the CPU, "
                    "for a smoke run of this script")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--baseline", metavar="PTC", help="another ptc build (with its ptc-runner "
                    "beside it), run in the same rounds: a change measured side by side")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved runs of each ptc; the "
                    "median of their medians is reported")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as wd:
        runs, base = [], []
        for _ in range(max(args.rounds, 1)):
            runs.append(run_ptc(args, wd))
            if args.baseline:
                base.append(run_ptc(args, wd, args.baseline, "g_base"))
        ours = sorted(runs, key=lambda r: r["ms"])[len(runs) // 2]
        baseline = sorted(base, key=lambda r: r["ms"])[len(base) // 2] if base else None
    theirs, why = (None, "--no-torch") if args.no_torch else run_torch(args)
    # PTC_COMMIT: a copy of the tree without .git (a lent GPU machine gets one) names its commit
    commit = os.environ.get("PTC_COMMIT") or \
        sh(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).stdout.strip() or "unknown"
    now = datetime.datetime.now()
    lines = [f"# cuda_train: ptc on {args.device} vs PyTorch, {now:%Y-%m-%d %H:%M}", "",
             "    " + " ".join(["python3", "bench/cuda_train.py"] + sys.argv[1:]), "",
             f"- device: {device_name()} (ptc --device {args.device})",
             f"- commit: {commit}; model {args.model} ({CONFIGS[args.model][1]}), {args.precision}, "
             f"float32 matmul precision {args.matmul_precision} (both sides)",
             f"- ptc: `{ours['cmd']}`"]
    if baseline:
        lines.append(f"- baseline: `{baseline['cmd']}`; {len(runs)} interleaved rounds, "
                     f"each row the median round")
    lines += ["", "| system | ms/step (median) | tok/s | MFU |", "|---|---|---|---|",
              f"| ptc | {ours['ms']:.1f} | {ours['tok_s']:.0f} | {ours['mfu']:.1f}% |"]
    if baseline:
        lines.append(f"| ptc baseline | {baseline['ms']:.1f} | {baseline['tok_s']:.0f} | "
                     f"{baseline['mfu']:.1f}% |")
    if theirs:
        lines.append(f"| PyTorch {theirs['torch']} eager ({args.torch_device}) | {theirs['ms']:.1f} | "
                     f"{theirs['tok_s']:.0f} | |")
        lines += ["", f"ptc / PyTorch: {ours['tok_s'] / theirs['tok_s']:.2f}x"]
    else:
        lines += ["", f"PyTorch not run: {why}"]
    if baseline:
        lines += ["", f"ptc / baseline: {ours['tok_s'] / baseline['tok_s']:.3f}x"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.device == "cuda":  # smoke runs on the emulation are not results
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, f"cuda_train_{now:%Y-%m-%d_%H%M%S}.md")
        with open(path, "w") as f:
            f.write(text)
        print("wrote " + path)


if __name__ == "__main__":
    main()
