#!/usr/bin/env python3
"""--matmul-precision (PyTorch's set_float32_matmul_precision) end to end: gpt2_tiny in f32, three
steps at highest, high and medium, on the CPU (--backend cpu) and on the CUDA backend's host
emulation (--device cuda-emulated), each against the CPU at highest (the f32 GEMMs):

  - the run says which precision ran: on the CPU the one asked where it has the units (high: AMX-
    BF16; medium: AVX-512-BF16 or AMX; and oneDNN), else highest and that the units are missing;
    on a GPU the one asked (TF32 and bf16 tensor cores, which the emulation rounds to);
  - highest on either device is the f32 run (losses within 1e-5);
  - a lower precision that ran changes the numbers (else the setting did not reach the GEMMs),
    by less than it allows: losses and gradient norms within 1e-3 (high) and 2e-2 (medium).

Usage: matmul_precision.py PTC SOURCE_DIR
"""
import os
import re
import subprocess
import sys
import tempfile

from tally import check, summary  # tests/train/tally.py, beside this script

PTC, SRC = sys.argv[1], sys.argv[2]
STEPS = 3
TOL = {'highest': 1e-5, 'high': 1e-3, 'medium': 2e-2}



def run(exe, device, precision, wd):
    cmd = [exe, '--steps', str(STEPS), '--seed', '3', '--threads', '1', '--device', device,
           '--matmul-precision', precision]
    if device == 'cpu':
        cmd += ['--backend', 'cpu']
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=wd, timeout=600)
    steps = [(float(a), float(b)) for a, b in re.findall(
        r'step +\d+/\d+ \| loss ([0-9.eE+-]+) \| lr \S+ \| norm ([0-9.eE+-]+)', p.stdout)]
    ran = re.search(r'f32 matmul precision (\w+)( \(this CPU lacks)?', p.stdout)
    return p, steps, ran


def main():
    with tempfile.TemporaryDirectory() as wd:
        exe = os.path.join(wd, 'g')
        subprocess.run([PTC, os.path.join(SRC, 'examples', 'gpt2_tiny.ptm'), '-o', exe, '-D',
                        'batch=2', '-D', 'seq=8'], check=True, capture_output=True)
        ref = None
        for device in ('cpu', 'cuda-emulated'):
            for precision in ('highest', 'high', 'medium'):
                p, steps, ran = run(exe, device, precision, wd)
                what = '%s at %s' % (device, precision)
                if not check(p.returncode == 0 and len(steps) == STEPS,
                             '%s: ran (%s)' % (what, p.stderr.strip()[-300:])):
                    continue
                if ref is None:
                    ref = steps  # the CPU at highest
                if precision == 'highest':
                    check(ran is None, '%s: no precision line in the summary' % what)
                    took = 'highest'
                else:
                    took = ran.group(1) if ran else None
                    lacks = bool(ran and ran.group(2))
                    check(took == precision or (device == 'cpu' and took == 'highest' and lacks),
                          '%s: the summary says %s ran%s' % (
                              what, took, ' (the CPU lacks the units)' if lacks else ''))
                worst = max(abs(e - c) / abs(c) for (c0, c1), (e0, e1) in zip(ref, steps)
                            for c, e in ((c0, e0), (c1, e1)))
                tol = TOL[took or 'highest']
                check(worst <= tol, '%s: losses and gradient norms within %g of the f32 run '
                      '(worst %.2e)' % (what, tol, worst))
                if took in ('high', 'medium'):
                    check(worst > 0, '%s: the numbers moved (the setting reached the GEMMs)'
                          % what)
    return summary()


if __name__ == '__main__':
    sys.exit(main())
