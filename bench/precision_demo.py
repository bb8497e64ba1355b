#!/usr/bin/python3
"""Mixed precision on the README demo: ptc fp32, ptc --precision bf16 and PyTorch (fp32 and CPU
autocast bf16), side by side on the same weights and the same batches.

The demo's run (tools/demo.sh): examples/gpt2_tiny.ptm on the shipped corpus, tokenized with a 5%
validation split, 300 steps at --lr 3e-3 --warmup 20 (cosine to lr/10), gradient clipping at 1.0,
the model's AdamW (betas 0.9/0.95, weight decay 0.1 on matrices). Every run starts from one set of
GPT-2 initial weights written here (matrices N(0, 0.02), the residual projections
N(0, 0.02/sqrt(2 layers)), gains 1, biases 0), given to ptc with --init-from; PyTorch reads the
same llm.c batches in the same order (batch k = tokens k*B*T .. (k+1)*B*T).

PyTorch bf16 is torch.autocast("cpu", dtype=torch.bfloat16) around the forward and the loss, fp32
weights and optimizer: autocast runs the matmuls in bf16 and keeps the rest (layernorm, softmax,
the loss) in fp32, the common way to train in bf16 with PyTorch. ptc's policy (--precision bf16,
README) stores weights' working copies, activations and gradients in bf16 and keeps fp32 masters.

Reports, per run: the mean loss of the last 10 steps, the validation loss after the last step
(over 4 batches of the validation split, as the executables' --val-batches default), tokens per
second; and bf16 against fp32 for each system. --check makes it a test: ptc's bf16 must end
within 2% of ptc's fp32 (last-10 mean and validation loss); exit 1 otherwise. Without --check it
is a benchmark and writes bench/results/precision_demo_<date>.md.

    /usr/bin/python3 bench/precision_demo.py [--ptc build/tools/ptc] [--steps 300] [--check]
        [--no-torch]
"""
import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import random
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, 'examples', 'gpt2_tiny.ptm')


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit('failed: %s\n%s%s' % (' '.join(cmd), r.stdout[-2000:], r.stderr[-2000:]))
    return r.stdout


def ptc_run(ptc, precision, wd, init, steps, threads):
    exe = os.path.join(wd, 'g_' + precision)
    run([ptc, '--precision', precision, MODEL, '-o', exe])
    log = os.path.join(wd, precision + '.jsonl')
    t0 = time.perf_counter()
    run([exe, '--init-from', init, '--data', os.path.join(wd, 'train.bin'),
         '--val-data', os.path.join(wd, 'val.bin'), '--val-every', str(steps), '--steps',
         str(steps), '--lr', '3e-3', '--warmup', '20', '--threads', str(threads), '--log', log,
         '--quiet'])
    wall = time.perf_counter() - t0
    recs = [json.loads(x) for x in open(log)]
    losses = [r['loss'] for r in recs if 'loss' in r]
    val = [r['val_loss'] for r in recs if 'val_loss' in r][-1]
    ms = sum(r['step_ms'] for r in recs if 'loss' in r and r['step'] > 10)
    return {'losses': losses, 'val': val, 'tokps': None if not ms else
            (len(losses) - 10) * 4 * 64 / (ms / 1e3), 'wall': wall}


SPEED_MODELS = [
    ('gpt2_tiny (4 x 64)', 'examples/gpt2_tiny.ptm', [], 60, 10),
    ('gpt2_20m (8 x 256: d=512, 5 layers, vocab 8192)', 'examples/gpt2.ptm',
     ['-D', 'vocab=8192', '-D', 'ctx=256', '-D', 'd=512', '-D', 'heads=8', '-D', 'layers=5',
      '-D', 'batch=8', '-D', 'seq=256'], 6, 2),
]


def speed_rounds(ptc, rounds, threads):
    out = []
    with tempfile.TemporaryDirectory(prefix='ptc-speed-') as wd:
        for name, rel, defs, steps, warm in SPEED_MODELS:
            tok = {}
            for prec in ('fp32', 'bf16', 'fp16'):
                exe = os.path.join(wd, prec)
                run([ptc, '--precision', prec] + defs + [os.path.join(ROOT, rel), '-o', exe])
                tok[prec] = []
            for _ in range(rounds):
                for prec in ('fp32', 'bf16', 'fp16'):
                    log = os.path.join(wd, prec + '.jsonl')
                    run([os.path.join(wd, prec), '--steps', str(steps), '--threads', str(threads),
                         '--schedule', 'constant', '--log', log, '--quiet'])
                    recs = [json.loads(x) for x in open(log) if '"loss"' in x]
                    timed = [r for r in recs if r['step'] > warm]
                    ntok = sum(r['tokens_per_s'] * r['step_ms'] / 1e3 for r in timed)
                    tok[prec].append(ntok / (sum(r['step_ms'] for r in timed) / 1e3))
            med = lambda v: sorted(v)[len(v) // 2]
            out.append((name, med(tok['fp32']), med(tok['bf16']), med(tok['fp16'])))
    return out


def lr_at(t, peak, warmup, steps):  # runtime/train/train.c, ptrt_lr_at (cosine to peak/10)
    if warmup > 0 and t <= warmup:
        return peak * t / warmup
    frac = min(1.0, (t - warmup) / (steps - warmup))
    floor = peak / 10
    return floor + 0.5 * (1 + math.cos(math.pi * frac)) * (peak - floor)


def torch_run(torch, cmp, init, tokens, val_tokens, steps, bf16, threads):
    text = open(MODEL).read()
    consts = cmp.parse_consts(text, {})
    model = cmp.GPT2(text, consts)
    opt = cmp.parse_optimizer(text)
    params = model.params()
    torch.set_num_threads(threads)
    P, optim = cmp.torch_state(init, params, opt, 3e-3, torch.float32)
    B, T = model.batch, model.seq
    losses, t_timed = [], 0.0
    for step in range(1, steps + 1):
        for g in optim.param_groups:
            g['lr'] = lr_at(step, 3e-3, 20, steps)
        x, y = cmp.batch_at(tokens, step - 1, B, T)
        t0 = time.perf_counter()
        optim.zero_grad()
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
            loss = cmp.cross_entropy(model.logits(P, x).float(), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(P.values()), 1.0)
        optim.step()
        if step > 10:
            t_timed += time.perf_counter() - t0
        losses.append(loss.item())
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
        vals = []
        for k in range(4):
            x, y = cmp.batch_at(val_tokens, k, B, T)
            vals.append(cmp.cross_entropy(model.logits(P, x).float(), y).item())
    return {'losses': losses, 'val': sum(vals) / len(vals),
            'tokps': (steps - 10) * B * T / t_timed, 'wall': None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--ptc', default=os.path.join(ROOT, 'build', 'tools', 'ptc'))
    ap.add_argument('--steps', type=int, default=300)
    ap.add_argument('--threads', type=int, default=os.cpu_count())
    ap.add_argument('--check', action='store_true', help='a test: bf16 within 2%% of fp32')
    ap.add_argument('--no-torch', action='store_true')
    ap.add_argument('--rounds', type=int, default=3,
                    help='speed: interleaved fp32/bf16 rounds of each model (0: none)')
    args = ap.parse_args()
    tokenize = os.path.join(os.path.dirname(args.ptc), 'ptc-tokenize')
    spec = importlib.util.spec_from_file_location('compare',
                                                  os.path.join(ROOT, 'tests/torch/compare.py'))
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print('precision_demo.py: no torch here (run with /usr/bin/python3): ptc alone')
    with tempfile.TemporaryDirectory(prefix='ptc-prec-') as wd:
        run([tokenize, os.path.join(ROOT, 'examples/data/corpus.txt'), '-o',
             os.path.join(wd, 'train.bin'), '--val-fraction', '0.05', '--val-output',
             os.path.join(wd, 'val.bin')])
        # one set of GPT-2 initial weights for every run (Python's own generator: the check
        # runs without numpy or torch)
        if torch:
            sys.modules.setdefault('torch', torch)
            cmp = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(cmp)
        gen = random.Random(1)
        layers, d, vocab, ctx = 2, 64, 256, 64
        normal = lambda std, *shape: ([std * gen.gauss(0, 1) for _ in range(math.prod(shape))],
                                      list(shape))
        const = lambda v, n: ([v] * n, [n])
        init = {'wte': normal(0.02, vocab, d), 'wpe': normal(0.02, ctx, d)}
        for i in range(layers):
            h = 'h.%d.' % i
            proj = 0.02 / math.sqrt(2 * layers)
            init.update({h + 'ln_1.g': const(1.0, d), h + 'ln_1.b': const(0.0, d),
                         h + 'attn.w_qkv': normal(0.02, d, 3 * d),
                         h + 'attn.b_qkv': const(0.0, 3 * d),
                         h + 'attn.w_o': normal(proj, d, d), h + 'attn.b_o': const(0.0, d),
                         h + 'ln_2.g': const(1.0, d), h + 'ln_2.b': const(0.0, d),
                         h + 'mlp.w_fc': normal(0.02, d, 4 * d),
                         h + 'mlp.b_fc': const(0.0, 4 * d),
                         h + 'mlp.w_proj': normal(proj, 4 * d, d),
                         h + 'mlp.b_proj': const(0.0, d)})
        init.update({'ln_f.g': const(1.0, d), 'ln_f.b': const(0.0, d)})
        path = os.path.join(wd, 'init.safetensors')
        header, blobs, off = {}, [], 0
        for k, (v, shape) in init.items():
            b = struct.pack('<%df' % len(v), *v)
            header[k] = {'dtype': 'F32', 'shape': shape, 'data_offsets': [off, off + len(b)]}
            off += len(b)
            blobs.append(b)
        h = json.dumps(header).encode()
        h += b' ' * (-len(h) % 8)
        with open(path, 'wb') as f:
            f.write(len(h).to_bytes(8, 'little') + h + b''.join(blobs))

        res = {}
        for prec in ('fp32', 'bf16'):
            res['ptc ' + prec] = ptc_run(args.ptc, prec, wd, path, args.steps, args.threads)
        if torch:
            import numpy as np
            init = {k: np.array(v, dtype=np.float32).reshape(shape)
                    for k, (v, shape) in init.items()}

            def tokens_of(name):
                with open(os.path.join(wd, name), 'rb') as f:
                    f.read(1024)
                    return np.frombuffer(f.read(), dtype='<u2').astype(np.int64)
            tr, va = tokens_of('train.bin'), tokens_of('val.bin')
            for prec in ('fp32', 'bf16'):
                res['PyTorch %s %s' % (torch.__version__, 'autocast bf16' if prec == 'bf16'
                                       else 'fp32')] = torch_run(torch, cmp, init, tr, va,
                                                                 args.steps, prec == 'bf16',
                                                                 args.threads)

    speed = []
    if not args.check and args.rounds > 0:
        speed = speed_rounds(args.ptc, args.rounds, args.threads)
    rows = []
    for name, r in res.items():
        last = sum(r['losses'][-10:]) / 10
        rows.append((name, r['losses'][0], last, r['val'], r['tokps']))
    lines = ['| run | step-1 loss | last-10 mean loss | val loss | tok/s |',
             '|-----|------------:|------------------:|---------:|------:|']
    for name, first, last, val, tokps in rows:
        lines.append('| %s | %.4f | %.4f | %.4f | %s |' % (name, first, last, val,
                                                            '%.0f' % tokps if tokps else '-'))
    ok = True
    for sysname in ('ptc', 'PyTorch'):
        pair = [r for r in rows if r[0].startswith(sysname)]
        if len(pair) == 2:
            (n32, _, l32, v32, t32), (n16, _, l16, v16, t16) = pair
            dl, dv = (l16 - l32) / l32, (v16 - v32) / v32
            lines.append('')
            lines.append('%s bf16 against fp32: last-10 loss %+.2f%%, val loss %+.2f%%, tok/s '
                         'x%.2f' % (sysname, 100 * dl, 100 * dv, t16 / t32))
            if sysname == 'ptc':
                ok = abs(dl) <= 0.02 and abs(dv) <= 0.02
    if speed:
        lines += ['', 'Speed, ptc alone (median of %d interleaved rounds, tok/s of the timed steps '
                  'from the step log):' % args.rounds, '',
                  '| model | fp32 tok/s | bf16 tok/s | bf16 / fp32 | fp16 tok/s | fp16 / fp32 |',
                  '|---|---:|---:|---:|---:|---:|']
        for name, t32, t16, h16 in speed:
            lines.append('| %s | %.0f | %.0f | x%.2f | %.0f | x%.2f |' % (name, t32, t16, t16 / t32,
                                                                        h16, h16 / t32))
    print('\n'.join(lines))
    if args.check:
        print('PASS' if ok else 'FAIL', 'ptc bf16 within 2%% of ptc fp32 over %d steps' %
              args.steps)
        return 0 if ok else 1
    commit = subprocess.run(['git', '-C', ROOT, 'rev-parse', '--short', 'HEAD'],
                            capture_output=True, text=True).stdout.strip()
    stamp = datetime.datetime.now().strftime('%Y-%m-%d_%H%M%S')
    out = os.path.join(ROOT, 'bench', 'results', 'precision_demo_%s.md' % stamp)
    with open(out, 'w') as f:
        f.write('# precision_demo.py, %s\n\n' % stamp.replace('_', ' '))
        f.write('- command: `/usr/bin/python3 bench/precision_demo.py --steps %d --threads %d '
                '--rounds %d`\n' % (args.steps, args.threads, args.rounds))
        f.write('- commit: %s; machine: %s, %d CPUs\n\n' % (commit, platform.processor() or
                                                           platform.machine(), os.cpu_count()))
        f.write('\n'.join(lines) + '\n')
    print('wrote', out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
