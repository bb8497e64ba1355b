#!/usr/bin/env python3
"""Planned memory against the process's measured peak RSS.

For each configuration it compiles the model, reads the plan's arenas (`ptc --emit plan-json`:
the bytes every rank allocates at start, summed over the ranks the process runs as threads),
trains a few steps and takes the process's peak resident set size (getrusage of the child,
ru_maxrss). It prints a table (planned, measured, measured - planned, ratio) and, with --out,
writes it with the machine, date, commit and command to bench/results/memory_rss_<date>.md.
The target: anonymous resident memory (heap, arenas, stacks: RssAnon, sampled) at most the
planned total plus 64 MiB (thread stacks, data buffers, messages in flight, the libraries' own
heaps). The table shows the whole RSS beside it, which also counts the file-backed pages of the
libraries' code, shared between processes and reclaimable: libLLVM alone has about 46 MB of its
code resident once the jit backend has loaded its kernels, oneDNN about 5 MB, fixed costs that
do not grow with the plan. The executable runs on its default backend (jit where built with
LLVM); the first start of a plan compiles its fused kernels, and LLVM's heap while compiling
(about 15-80 MB, freed after) is a one-time cost, not the step's: each configuration runs once,
in another process, to fill the on-disk kernel cache before the measured run.

    python3 bench/memory_rss.py [--ptc build/tools/ptc] [--steps 2] [--out bench/results]
        [--check]

With --check it exits 1 when a configuration exceeds the target (the test suite runs a small one);
otherwise it never fails on the numbers.
"""
import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLACK = 64 << 20

GPT20M = ["-D", "vocab=8192", "-D", "ctx=256", "-D", "d=512", "-D", "heads=8", "-D", "layers=5",
          "-D", "batch=8", "-D", "seq=256"]
GPT_SMALL = ["-D", "vocab=4096", "-D", "ctx=128", "-D", "d=256", "-D", "heads=4", "-D", "layers=2",
             "-D", "batch=4", "-D", "seq=128"]
GPT_WIDE_VOCAB = ["-D", "vocab=32768", "-D", "ctx=256", "-D", "d=128", "-D", "heads=2", "-D",
                  "layers=1", "-D", "batch=4", "-D", "seq=256"]
MOE_SMALL = ["-D", "vocab=4096", "-D", "d=256", "-D", "heads=4", "-D", "kv_heads=2", "-D",
             "n_layers=2", "-D", "experts=8", "-D", "top_k=2", "-D", "ffn=512", "-D", "batch=16",
             "-D", "seq=128"]
CONFIGS = {
    "gpt2_20m": ("examples/gpt2.ptm", GPT20M),
    "gpt2_20m_dp2_tp2_sp_zero3": ("examples/gpt2.ptm", GPT20M + [
        "--mesh", "dp=2,tp=2", "--seq-parallel", "--zero", "3"]),
    "gpt2_20m_bf16": ("examples/gpt2.ptm", GPT20M + ["--precision", "bf16"]),
    "gpt2_20m_fp16": ("examples/gpt2.ptm", GPT20M + ["--precision", "fp16"]),
    "gpt2_small": ("examples/gpt2.ptm", GPT_SMALL),
    "gpt2_small_dp2_tp2_sp_zero3": ("examples/gpt2.ptm", GPT_SMALL + [
        "--mesh", "dp=2,tp=2", "--seq-parallel", "--zero", "3"]),
    # f16 storage with a wide vocabulary: no CPU library has an f16 GEMM (nor a bf16 one without
    # AVX-512 BF16 or AMX), so every product runs on f32 copies of its operands, which the plan
    # does not hold; whole copies of the logits' gradient put the process 181 MiB past its plan,
    # tiles of them 33 MiB
    "gpt2_wide_vocab_fp16": ("examples/gpt2.ptm", GPT_WIDE_VOCAB + ["--precision", "fp16"]),
    # a small Mixtral (bench/cpu_train.py's moe_small, batch 16): the experts' blocks and lanes'
    # buffer (cpu_moe.c, at most 16 + 16 MiB) are scratch outside the plan, beside the GEMM tiles
    "moe_small": ("examples/moe.ptm", MOE_SMALL),
    "moe_small_ep2": ("examples/moe.ptm", MOE_SMALL + ["--mesh", "ep=2"]),
}


def planned_bytes(ptc, model, args):
    out = subprocess.run([ptc] + args + ["--emit", "plan-json", model], capture_output=True,
                         text=True, check=True).stdout
    plan = json.loads(out)
    total = 0
    for prog in plan["programs"]:
        arenas = sum(prog["memory_bytes"]["arenas"].values())
        total += arenas * len(prog["ranks"])
    return total


def measure(ptc, name, steps, wd):
    rel, args = CONFIGS[name]
    model = os.path.join(ROOT, rel)
    exe = os.path.join(wd, "exe")
    subprocess.run([ptc] + args + [model, "-o", exe], check=True, capture_output=True)
    planned = planned_bytes(ptc, model, args)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.Popen([exe, "--steps", str(steps), "--quiet"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    anon = 0  # the largest RssAnon seen, sampled every 2 ms (the arenas stay from start to end)
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        anon = max(anon, int(line.split()[1]) * 1024)
        except OSError:
            pass
        time.sleep(0.002)
    err = proc.stderr.read()
    if proc.returncode:
        sys.exit(f"{name}: the run failed: {err.strip()}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if rss < before * 1024:
        sys.exit("getrusage reports a smaller peak than a previous child's: run one per process")
    return {"config": name, "command": " ".join([rel] + args), "planned": planned, "rss": rss,
            "anon": anon}


def warm_kernel_cache(ptc, name):
    """Compiles the configuration and runs one step, so that its kernels are in the cache."""
    rel, args = CONFIGS[name]
    with tempfile.TemporaryDirectory(prefix="ptc-rss-warm-") as wd:
        exe = os.path.join(wd, "exe")
        subprocess.run([ptc] + args + [os.path.join(ROOT, rel), "-o", exe], check=True,
                       capture_output=True)
        subprocess.run([exe, "--steps", "1", "--quiet"], check=True, capture_output=True)


def mib(b):
    return f"{b / (1 << 20):,.1f}"


def table(rows):
    head = (f"{'configuration':<28} {'planned MiB':>12} {'RSS MiB':>10} {'anon MiB':>9} "
            f"{'anon - planned':>15} {'ratio':>6}  within +64 MiB")
    lines = [head, "-" * len(head)]
    for r in rows:
        ok = r["anon"] <= r["planned"] + SLACK
        lines.append(f"{r['config']:<28} {mib(r['planned']):>12} {mib(r['rss']):>10} "
                     f"{mib(r['anon']):>9} {mib(r['anon'] - r['planned']):>15} "
                     f"{r['anon'] / r['planned']:>6.3f}  {'yes' if ok else 'NO'}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ptc", default=os.path.join(ROOT, "build", "tools", "ptc"))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--configs", default="gpt2_20m,gpt2_20m_dp2_tp2_sp_zero3",
                    help="comma-separated: " + ", ".join(CONFIGS))
    ap.add_argument("--one", help="measure one configuration in this process (internal)")
    ap.add_argument("--out")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if args.one:  # a fresh process per configuration: ru_maxrss of children is a maximum
        with tempfile.TemporaryDirectory(prefix="ptc-rss-") as wd:
            print(json.dumps(measure(args.ptc, args.one, args.steps, wd)))
        return 0
    rows = []
    for name in args.configs.split(","):
        if name not in CONFIGS:
            ap.error(f"unknown configuration '{name}' (known: {', '.join(CONFIGS)})")
        warm_kernel_cache(args.ptc, name)
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--ptc", args.ptc,
                              "--steps", str(args.steps), "--one", name],
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit(out.stderr.strip() or out.stdout.strip())
        rows.append(json.loads(out.stdout))
    text = table(rows)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        path = os.path.join(args.out, f"memory_rss_{stamp}.md")
        with open(path, "w") as f:
            f.write(f"# memory_rss: planned bytes against measured peak RSS, {stamp}\n\n")
            f.write("    python3 " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])
                    + "\n\n")
            f.write(f"- machine: `{' '.join(platform.uname())}`, nproc {os.cpu_count()}\n")
            f.write(f"- commit: {commit}; {args.steps} training steps per run, CPU backend\n")
            f.write("- planned: the sum of every arena of every rank the process runs (ranks "
                    "are threads); RSS: the process's peak resident set size (ru_maxrss); "
                    "anon: its peak anonymous resident memory (RssAnon, sampled every 2 ms), "
                    "which the check holds to planned + 64 MiB\n\n")
            f.write("```\n" + text + "\n```\n\n")
            for r in rows:
                f.write(f"- {r['config']}: `ptc {r['command']}`\n")
        print(f"results: {os.path.relpath(path, ROOT)}")
    bad = [r for r in rows if r["anon"] > r["planned"] + SLACK]
    return 1 if args.check and bad else 0


if __name__ == "__main__":
    sys.exit(main())
