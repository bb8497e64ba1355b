#!/usr/bin/env python3
"""fp16 dynamic loss scaling (--precision fp16), end to end through an executable:

1. A step whose scaled gradients overflow fp16 is skipped: with --loss-scale 2^40 the first step
   overflows, and its checkpoint holds exactly the initial weights (computed here from the
   initialisation function of runtime/exec/init.c, independently of ptc) and all-zero Adam
   moments: nothing of the step reached the weights or the optimizer state.
2. The scale follows the rule, step by step in the JSON log: divided by the growth factor after
   an overflow, multiplied by it after --loss-scale-window clean steps in a row, unchanged
   otherwise; the step line shows the scale and the skip.
3. A run resumed from a checkpoint continues with the scale, its clean-step count and the
   optimizer's step count: its final checkpoint is byte-identical to an uninterrupted run's.
4. bf16 needs no scaling: its executables take no loss-scale input.
5. --save-dtype bf16 exports the weights as BF16 tensors (the fp32 masters rounded), half the
   size, which --init-from reads back.
Usage: fp16_loss_scale.py PTC SOURCE_DIR
"""
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

from tally import check, summary  # tests/train/tally.py, beside this script

PTC, SRC = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SRC, 'examples', 'gpt2_tiny.ptm')
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15



def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def fnv1a64(name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


def init_values(name, kind, arg, n, seed):
    """runtime/exec/init.c, from its comment: element i of parameter NAME, rounded to float."""
    key = mix64(fnv1a64(name) ^ mix64((seed + GOLDEN) & M64))
    bits = lambda k: mix64((key + (k + 1) * GOLDEN) & M64)
    out = []
    for i in range(n):
        if kind == 'zeros':
            v = 0.0
        elif kind == 'ones':
            v = 1.0
        elif kind == 'normal':
            u1 = ((bits(2 * i) >> 11) + 1) * 2.0 ** -53
            u2 = (bits(2 * i + 1) >> 11) * 2.0 ** -53
            v = arg * math.sqrt(-2.0 * math.log(u1)) * math.cos(6.28318530717958647692 * u2)
        else:
            raise ValueError(kind)
        out.append(struct.unpack('<f', struct.pack('<f', v))[0])
    return out


def load(path):
    with open(path, 'rb') as f:
        data = f.read()
    n = struct.unpack('<Q', data[:8])[0]
    header = json.loads(data[8:8 + n])
    meta = header.pop('__metadata__', {})
    out = {}
    for name, t in header.items():
        s, e = t['data_offsets']
        out[name] = struct.unpack('<%df' % ((e - s) // 4), data[8 + n + s:8 + n + e])
    return out, meta


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode:
        sys.exit('failed: %s\n%s%s' % (' '.join(args), r.stdout, r.stderr))
    return r.stdout


with tempfile.TemporaryDirectory() as d:
    exe = os.path.join(d, 'g16')
    run(PTC, '--precision', 'fp16', MODEL, '-o', exe)
    ir = run(PTC, '--precision', 'fp16', '--emit', 'ir', MODEL)
    params = re.findall(r'param \{dtype=f16, shape=\[([0-9,]*)\], name="([^"]+)", '
                        r'init=(zeros|ones|normal)(?:\(([^)]*)\))?\}', ir)
    check(len(params) == 28, 'the fp16 model has 28 parameters, all f16 working copies '
          '(%d found)' % len(params))

    # 1. an overflow is skipped
    ck = os.path.join(d, 'ck')
    out = run(exe, '--steps', '1', '--seed', '7', '--loss-scale', str(2 ** 40),
              '--checkpoint-dir', ck, '--log', os.path.join(d, 'one.jsonl'))
    check('scale 1.09951e+12 (overflow: step skipped)' in out,
          'the step line shows the scale and the skipped step: ' + out.splitlines()[0][:110])
    w, meta = load(os.path.join(ck, 'step_00000001.safetensors'))
    same = all(list(w[name]) == init_values(name, kind, float(arg or 0),
                                            math.prod(int(x) for x in shape.split(',')), 7)
               for shape, name, kind, arg in params)
    check(same, 'after the skipped step every weight is its initial value, bit for bit')
    zero = all(not any(w['optim.%s.%s' % (k, name)]) for _, name, _, _ in params for k in 'mv')
    check(zero, 'and every Adam moment is still zero')
    check(meta.get('ptc.loss_scale') == str(2 ** 39) and meta.get('ptc.skipped_steps') == '1',
          'the checkpoint records the halved scale 2^39 and one skipped step: %s, %s' %
          (meta.get('ptc.loss_scale'), meta.get('ptc.skipped_steps')))

    # 2. the scale, step by step
    log = os.path.join(d, 'run.jsonl')
    run(exe, '--steps', '40', '--seed', '7', '--loss-scale', str(2 ** 24),
        '--loss-scale-window', '3', '--log', log, '--quiet')
    recs = [json.loads(x) for x in open(log) if '"loss"' in x]
    skipped = [r['skipped'] for r in recs]
    check(any(skipped) and not all(skipped), 'the run has skipped and clean steps (%d of %d '
          'skipped)' % (sum(skipped), len(skipped)))
    ok, clean = True, 0
    for a, b in zip(recs, recs[1:]):
        if a['skipped']:
            want, clean = a['loss_scale'] / 2, 0
        else:
            clean += 1
            want = a['loss_scale'] * 2 if clean == 3 else a['loss_scale']
            clean = 0 if clean == 3 else clean
        ok &= b['loss_scale'] == want
    check(ok, 'halved after each overflow, doubled after 3 clean steps: %s' %
          [r['loss_scale'] for r in recs[:12]])
    check(all(math.isfinite(r['loss']) for r in recs) and recs[-1]['loss'] < recs[0]['loss'],
          'and the model trains: loss %.4f -> %.4f' % (recs[0]['loss'], recs[-1]['loss']))

    # 3. resume continues the scale
    # (a constant schedule: a run of 5 steps then has the lr of the first 5 of 12)
    a = os.path.join(d, 'a')
    common = ['--seed', '7', '--loss-scale', str(2 ** 22), '--loss-scale-window', '3', '--quiet',
              '--schedule', 'constant']
    run(exe, '--steps', '12', '--checkpoint-dir', a, *common)
    run(exe, '--steps', '5', '--checkpoint-dir', os.path.join(d, 'c'), *common)
    run(exe, '--steps', '12', '--checkpoint-dir', os.path.join(d, 'c'), '--resume', *common)
    fa = open(os.path.join(a, 'step_00000012.safetensors'), 'rb').read()
    fc = open(os.path.join(d, 'c', 'step_00000012.safetensors'), 'rb').read()
    check(fa == fc, 'a run resumed at step 5 ends byte-identical to an uninterrupted one')

    # 4. bf16 has no scaling
    plan = run(PTC, '--precision', 'bf16', '--emit', 'program', MODEL)
    check('loss_scale' not in plan, 'a bf16 plan has no loss-scale input')

    # 5. bf16 export
    w32, w16 = os.path.join(d, 'w32.safetensors'), os.path.join(d, 'w16.safetensors')
    run(exe, '--steps', '2', '--seed', '7', '--quiet', '--save', w32)
    run(exe, '--steps', '2', '--seed', '7', '--quiet', '--save', w16, '--save-dtype', 'bf16')
    with open(w16, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    dtypes = {t['dtype'] for k, t in header.items() if k != '__metadata__'}
    full, _ = load(w32)
    rounded = True
    for k, t in header.items():
        if k == '__metadata__':
            continue
        a, b = t['data_offsets']
        bits = struct.unpack('<%dH' % ((b - a) // 2), blob[a:b])
        for x, h in zip(full[k], bits):
            u = struct.unpack('<I', struct.pack('<f', x))[0]
            rounded &= h == ((u + 0x7fff + ((u >> 16) & 1)) >> 16) & 0xffff
    check(dtypes == {'BF16'} and rounded and os.path.getsize(w16) < 0.6 * os.path.getsize(w32),
          '--save-dtype bf16: BF16 tensors, the fp32 weights rounded to nearest even, %d bytes '
          'against %d' % (os.path.getsize(w16), os.path.getsize(w32)))
    out = run(exe, '--init-from', w16, '--steps', '1', '--seed', '7')
    check('loss' in out, '--init-from reads a bf16 export back')

sys.exit(summary())
