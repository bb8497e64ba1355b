#!/usr/bin/env python3
"""The CUDA backend without a GPU (--device cuda-emulated, runtime/backend/cuda): the executable's
whole training step through the CUDA backend itself (cuMemAlloc arenas, the plan's CUDA C built
and launched kernel by kernel, GEMMs from the column-major description cuBLASLt gets, copies and
syncs through the driver's calls), over the host emulation of the driver, against the CPU
backend on the same plan: every step's loss and gradient norm within 1e-5 (three steps: each
loss after the updates before it; 2e-3 in 16 bits) and, on one device, the first step's
gradients (--dump-grads) within 1e-4 of each tensor's largest (2e-2 in 16 bits), for each model
and mesh below. Plans of several ranks run them as threads; their collectives go through NCCL
where each rank has its own (emulated) GPU, through the device communicator in the GPU's memory
where all share one (runtime/comm/inproc.h, ptrt_inproc_new_on), else through host memory
(runtime/comm/staged.h): each case checks the run chose the one it should. Where NVRTC is
installed, each unit the emulation builds is compiled by NVRTC too (PTC_CUDA_EMULATED_NVRTC), and
one it refuses fails the case as it would fail on a GPU.

Under mpirun (where the machine has it and the build has MPI), the ranks run as processes: NCCL
across processes (each group's ncclUniqueId through MPI, the emulated NCCL moving its bytes over
MPI), 2 processes x 2 ranks, and the fallback to host memory when the processes' ranks share a
GPU; each against the CPU run. With NCCL the collectives run in the background (their own stream,
which the emulation runs only when the kernels' stream waits for it): the comparisons then also
check that the executor waits wherever an instruction needs a collective's buffers.

With --device cuda the same comparison runs on a real GPU (ctest label gpu: `ctest -L gpu`); it
exits 77 (skipped), saying why, where the machine has no CUDA driver or GPU.

--quick runs the cases of QUICK alone (one of each communicator, pipeline, 16-bit storage and
the experts) and one mpirun: the sanitizer build's run (tests/CMakeLists.txt passes it there),
where the host code is what the sanitizers check and every case costs several times as much;
the plain build runs them all.

Usage: cuda_emulated.py PTC SOURCE_DIR [--device cuda-emulated|cuda] [--quick]
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

from tally import check, summary  # tests/train/tally.py, beside this script

PTC, SRC = sys.argv[1], sys.argv[2]
ARGS = sys.argv[3:]
DEVICE = ARGS[ARGS.index('--device') + 1] if '--device' in ARGS[:-1] else 'cuda-emulated'
QUICK_RUN = '--quick' in ARGS
SMALL = ['-D', 'batch=2', '-D', 'seq=8']
CASES = [  # (name, model, ptc flags)
    ('gpt2_tiny', 'gpt2_tiny.ptm', SMALL),
    ('bert_tiny', 'bert_tiny.ptm', SMALL),
    ('llama_tiny', 'llama_tiny.ptm', SMALL),
    ('mlp', 'mlp.ptm', []),
    # 80 rows: the bias gradients (sum_to) and the norms' parameter gradients as two-pass column
    # sums (kir_ops.c: PTC_OPK_COLSUM_ROWS), a thread per (chunk, column)
    ('gpt2_tiny 80 rows', 'gpt2_tiny.ptm', ['-D', 'batch=2', '-D', 'seq=40']),
    ('llama_tiny 80 rows', 'llama_tiny.ptm', ['-D', 'batch=2', '-D', 'seq=40']),
    # 4 ranks on the one (emulated) GPU: tensor and data parallel, sequence parallel, ZeRO-1;
    # their collectives in the GPU's memory (the device communicator)
    ('gpt2_tiny dp=2,tp=2 SP ZeRO-1', 'gpt2_tiny.ptm',
     SMALL + ['--mesh', 'dp=2,tp=2', '--seq-parallel', '--zero', '1']),
    # the same 4 ranks on 2 GPUs (rank r on GPU r mod 2): each rank's memory, module and launches
    # on its own GPU, which the emulation checks; collectives through host memory
    ('gpt2_tiny dp=2,tp=2 on 2 GPUs', 'gpt2_tiny.ptm',
     SMALL + ['--mesh', 'dp=2,tp=2', '--zero', '3'], {'PTC_CUDA_EMULATED_GPUS': '2'}),
    # one GPU per rank: the collectives through NCCL (emulated: runtime/backend/cuda/nccl_comm.c's
    # communicators, splits, strided packing of sequence-parallel gathers, ZeRO-3's gathers)
    ('gpt2_tiny dp=2,tp=2 SP ZeRO-3 on 4 GPUs (NCCL)', 'gpt2_tiny.ptm',
     SMALL + ['--mesh', 'dp=2,tp=2', '--seq-parallel', '--zero', '3'],
     {'PTC_CUDA_EMULATED_GPUS': '4'}),
    # grouped-query attention over more ranks than key/value heads (attention_shard)
    ('llama_tiny tp=4', 'llama_tiny.ptm', SMALL + ['--mesh', 'tp=4']),
    ('gpt2_tiny pp=2 1F1B', 'gpt2_tiny.ptm', ['-D', 'batch=4', '-D', 'seq=8', '--mesh', 'pp=2',
                                              '--microbatches', '2']),
    # the stages on 2 GPUs: NCCL's communicators, the sends between stages through the host
    ('gpt2_tiny pp=2,dp=2 1F1B on 4 GPUs (NCCL)', 'gpt2_tiny.ptm',
     ['-D', 'batch=4', '-D', 'seq=8', '--mesh', 'pp=2,dp=2', '--microbatches', '2'],
     {'PTC_CUDA_EMULATED_GPUS': '4'}),
    # 16-bit storage: bf16 GEMMs (cuBLASLt's bf16 operands), op kernels over bf16 and f16 bytes,
    # fp16 loss scaling; their attention on tensor cores (cuda_attention_mma.c), grouped-query
    # and sharded over ranks too
    ('gpt2_tiny bf16', 'gpt2_tiny.ptm', SMALL + ['--precision', 'bf16']),
    ('llama_tiny fp16 dp=2', 'llama_tiny.ptm', SMALL + ['--precision', 'fp16', '--mesh', 'dp=2']),
    ('llama_tiny bf16 80 rows tp=4', 'llama_tiny.ptm',
     ['-D', 'batch=2', '-D', 'seq=40', '--precision', 'bf16', '--mesh', 'tp=4']),
    ('llama_tiny bf16 head size 128', 'llama_tiny.ptm',
     SMALL + ['-D', 'd=256', '-D', 'heads=2', '-D', 'kv_heads=1', '--precision', 'bf16']),
    # the experts (moe_ffn, moe_ep_ffn and their gradients) on the GPU: cuda_moe.c's kernels
    # around cuBLASLt's GEMMs, expert parallelism's rows (moe_pack, moe_unpack,
    # moe_combine(_grad)) and the routing ops (moe_topk, moe_count, moe_route, ...; shard_slice
    # of expert parallelism's integer routes): nothing runs on the host; expert parallelism's
    # all_to_all_v through NCCL
    ('moe_tiny', 'moe_tiny.ptm', SMALL),
    ('moe_tiny capacity 1.0 (choices dropped)', 'moe_tiny.ptm',
     SMALL + ['-D', 'capacity_factor=1.0']),
    # GELU experts, raw gates, top 3 of 4, capacity 0.75; and each expert's rows in blocks of 3
    # (several GEMMs and kernel launches an expert)
    ('moe GELU top 3 capacity 0.75', 'tests/torch/moe_gelu_raw.ptm', SMALL),
    ('moe_tiny blocks of 3 rows', 'moe_tiny.ptm', SMALL, {'PTC_CUDA_MOE_BLOCK': '3'}),
    ('moe_tiny ep=2 capacity 1.0, blocks of 3 rows', 'moe_tiny.ptm',
     SMALL + ['--mesh', 'ep=2', '-D', 'capacity_factor=1.0'], {'PTC_CUDA_MOE_BLOCK': '3'}),
    ('moe_tiny dp=2,ep=2 on 4 GPUs (NCCL)', 'moe_tiny.ptm',
     ['-D', 'batch=4', '-D', 'seq=8', '--mesh', 'dp=2,ep=2'], {'PTC_CUDA_EMULATED_GPUS': '4'}),
    # ZeRO-3 over dp x ep: each parameter gathered and each gradient scattered by one NCCL call
    # over the group dp+ep, its members in the layout's order (ptc_plan_group)
    ('moe_tiny dp=2,ep=2 ZeRO-3 on 4 GPUs (NCCL)', 'moe_tiny.ptm',
     ['-D', 'batch=4', '-D', 'seq=8', '--mesh', 'dp=2,ep=2', '--zero', '3'],
     {'PTC_CUDA_EMULATED_GPUS': '4'}),
]
QUICK = {'gpt2_tiny', 'gpt2_tiny dp=2,tp=2 SP ZeRO-1', 'gpt2_tiny dp=2,tp=2 on 2 GPUs',
         'gpt2_tiny dp=2,tp=2 SP ZeRO-3 on 4 GPUs (NCCL)',
         'gpt2_tiny pp=2,dp=2 1F1B on 4 GPUs (NCCL)', 'llama_tiny fp16 dp=2',
         'llama_tiny bf16 80 rows tp=4', 'moe_tiny ep=2 capacity 1.0, blocks of 3 rows',
         'moe_tiny dp=2,ep=2 ZeRO-3 on 4 GPUs (NCCL)'}
assert QUICK <= {c[0] for c in CASES}
# relative: f32 sums in another order; 16 bits: a result rounded the other way now and then
TOL = {'bf16': 2e-3, 'fp16': 2e-3}
STEPS = 3



def read_safetensors(path):
    with open(path, 'rb') as f:
        raw = f.read()
    n = struct.unpack('<Q', raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == '__metadata__':
            continue
        a, b = t['data_offsets']
        data = raw[8 + n + a:8 + n + b]
        out[name] = struct.unpack('<%df' % (len(data) // 4), data)
    return out


def run(exe, device, wd, dump, env=None):
    grads = os.path.join(wd, 'grads_' + device)
    cmd = [exe, '--device', device, '--steps', str(STEPS), '--threads', '1', '--seed', '7']
    if dump:
        cmd += ['--dump-grads', grads]
    if device == 'cpu':
        cmd += ['--backend', 'cpu']
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=wd, timeout=600,
                       env=dict(os.environ, **(env or {})))
    steps = re.findall(r'step +\d+/\d+ \| loss ([0-9.eE+-]+|nan) \| lr \S+ \| norm ([0-9.eE+-]+|nan)',
                       p.stdout)
    return p, [(float(a), float(b)) for a, b in steps], grads


def communicator(flags, env):
    """What the run should print: NCCL where every rank has its own GPU, the device
    communicator where all share one, else host memory (None: one rank)."""
    if '--mesh' not in flags:
        return None
    ranks = 1
    for axis in flags[flags.index('--mesh') + 1].split(','):
        ranks *= int(axis.split('=')[1])
    gpus = int((env or {}).get('PTC_CUDA_EMULATED_GPUS', '1'))
    return ('collectives: NCCL' if ranks <= gpus else 'collectives: in GPU memory' if gpus == 1
            else 'collectives: through host memory')


def mpi_cases(wd):
    """dp=2,tp=2 SP ZeRO-3 with the ranks as MPI processes, against the CPU run on threads."""
    exe = os.path.join(wd, 'mpi_g')
    b = subprocess.run([PTC, os.path.join(SRC, 'examples', 'gpt2_tiny.ptm'), '-o', exe] + SMALL +
                       ['--mesh', 'dp=2,tp=2', '--seq-parallel', '--zero', '3'],
                       capture_output=True, text=True)
    if b.returncode:
        check(False, 'mpi: ptc -o: %s' % b.stderr.strip())
        return
    if not shutil.which('mpirun') or b'libmpi' not in subprocess.run(
            ['ldd', exe], capture_output=True).stdout:
        print('SKIP mpi: no mpirun, or no MPI in this build')
        return
    cpu, cs, _ = run(exe, 'cpu', wd, False)
    # (Open MPI refuses root without these; more processes than cores: oversubscribe; Open MPI
    # keeps allocations past MPI_Finalize that LeakSanitizer cannot attribute, as in mpi.sh)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT='1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM='1',
               OMPI_MCA_rmaps_base_oversubscribe='1',
               ASAN_OPTIONS=(os.environ.get('ASAN_OPTIONS', '') + ':detect_leaks=0').lstrip(':'))
    for what, np, extra, gpus, want in (
            ('4 processes on 4 GPUs', 4, [], '4', 'collectives: NCCL, one GPU per rank, across '
             'processes'),
            ('2 processes x 2 ranks on 4 GPUs', 2, ['--ranks-per-process', '2'], '4',
             'collectives: NCCL, one GPU per rank, across processes'),
            ('4 processes sharing GPU 0', 4, [], '1', 'share GPU')):
        if QUICK_RUN and np != 2:
            continue
        cmd = ['mpirun', '-np', str(np), exe, '--device', 'cuda-emulated', '--steps', str(STEPS),
               '--threads', '1', '--seed', '7'] + extra
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=wd, timeout=600,
                               env=dict(env, PTC_CUDA_EMULATED_GPUS=gpus))
        except subprocess.TimeoutExpired:
            check(False, 'mpi %s: timed out' % what)
            continue
        steps = [(float(a), float(b)) for a, b in re.findall(
            r'step +\d+/\d+ \| loss ([0-9.eE+-]+|nan) \| lr \S+ \| norm ([0-9.eE+-]+|nan)',
            p.stdout)]
        check(p.returncode == 0 and want in p.stderr and len(steps) == STEPS,
              'mpi %s: ran, %r (%s)' % (what, want, p.stderr.strip()[-300:]))
        if len(steps) == STEPS and len(cs) == STEPS:
            worst = max(abs(e - c) / (abs(c) + 1e-12) for (c0, c1), (e0, e1) in zip(cs, steps)
                        for c, e in ((c0, e0), (c1, e1)))
            check(worst <= 1e-5, 'mpi %s: losses and gradient norms within 1e-5 of the CPU '
                  'run on threads (worst %.2e)' % (what, worst))


def nvrtc_installed():
    """Whether the CUDA backend would find NVRTC (cudalib.c: $CUDA_HOME/lib64, the toolkit's
    /usr/local/cuda/lib64, the loader's path)."""
    dirs = [os.path.join(os.environ['CUDA_HOME'], 'lib64')] if os.environ.get('CUDA_HOME') else []
    dirs.append('/usr/local/cuda/lib64')
    names = ('libnvrtc.so.13', 'libnvrtc.so.12', 'libnvrtc.so')
    if any(os.path.exists(os.path.join(d, n)) for d in dirs for n in names):
        return True
    ldconfig = subprocess.run(['ldconfig', '-p'], capture_output=True, text=True)
    return any(n + ' ' in ldconfig.stdout for n in names)


def main():
    if DEVICE == 'cuda-emulated':
        # every unit the emulation builds goes through NVRTC too (cuda_emulated.c's nvrtc_too):
        # the host compiler took C that NVRTC refused, and only a GPU found it (2026-11-27)
        if nvrtc_installed():
            os.environ['PTC_CUDA_EMULATED_NVRTC'] = '1'
        else:
            print('note: no NVRTC here; the emulated kernels are not also compiled by NVRTC')
    with tempfile.TemporaryDirectory() as wd:
        for case in CASES:
            name, model, flags = case[:3]
            if QUICK_RUN and name not in QUICK:
                continue
            env = case[3] if len(case) > 3 else None
            exe = os.path.join(wd, re.sub(r'[^A-Za-z0-9_]', '_', name))
            b = subprocess.run([PTC, os.path.join(SRC, model if '/' in model else
                                             os.path.join('examples', model)), '-o', exe] + flags,
                               capture_output=True, text=True)
            if b.returncode:
                check(False, '%s: ptc -o: %s' % (name, b.stderr.strip()))
                continue
            dump = '--mesh' not in flags  # (--dump-grads: single-device plans)
            cpu, cs, cg = run(exe, 'cpu', wd, dump)
            emu, es, eg = run(exe, DEVICE, wd, dump, env)
            if DEVICE == 'cuda' and 'CUDA driver' in emu.stderr and 'not found' in emu.stderr:
                print('SKIP: no GPU here: ' + emu.stderr.strip())
                sys.exit(77)
            check(cpu.returncode == 0 and len(cs) == STEPS,
                  '%s: the CPU run (%s)' % (name, cpu.stderr.strip()[:300]))
            want = communicator(flags, env)
            if DEVICE == 'cuda-emulated' and want:  # (a real machine has its own GPU count)
                check(want in emu.stderr, '%s: %s chosen (%s)' % (
                    name, want, emu.stderr.strip()[:200]))
            if DEVICE == 'cuda-emulated' and want == 'collectives: NCCL':
                # NCCL's calls on a stream of their own, beside the kernels until one needs
                # their buffers: the emulation runs them only when the default stream waits for
                # them, so a wait the executor leaves out changes the results checked below
                m = re.search(r'overlap: ([0-9.]+) collectives a step ran in the background '
                              r'\(rank 0\), beside ([0-9.]+) instructions', emu.stdout)
                check(m and float(m.group(1)) > 0, '%s: collectives in the background (%s)' % (
                    name, m.group(0) if m else 'no overlap line'))
                # the small gradients' allreduces share NCCL calls (packed, reduced, copied out;
                # ZeRO-3 reduce-scatters its gradients instead)
                b = re.search(r'buckets: ([0-9.]+) small allreduces a step went to NCCL in '
                              r'([0-9.]+) calls', emu.stdout)
                check('--zero' in flags or (b and 0 < float(b.group(2)) < float(b.group(1))),
                      '%s: gradient buckets (%s)' % (name, b.group(0) if b else 'no buckets line'))
            host = re.search(r'no GPU kernel yet for (\S+):', emu.stderr)
            check(not host, '%s: instructions on the host: %s' % (
                name, host.group(1) if host else 'none'))
            check(emu.returncode == 0 and len(es) == STEPS,
                  '%s: the %s run (%s)' % (name, DEVICE, emu.stderr.strip()[:300]))
            if len(cs) != STEPS or len(es) != STEPS:
                continue
            worst = max(abs(e - c) / (abs(c) + 1e-12) for (c0, c1), (e0, e1) in zip(cs, es)
                        for c, e in ((c0, e0), (c1, e1)))
            tol = next((t for k, t in TOL.items() if k in flags), 1e-5)
            check(worst <= tol, '%s: losses and gradient norms of %d steps, worst relative '
                  'difference %.2e (cpu %s, %s %s)' % (name, STEPS, worst, cs, DEVICE, es))
            if not dump:
                continue
            g1 = 'grads_step_00000001.safetensors'
            a = read_safetensors(os.path.join(cg, g1))
            e = read_safetensors(os.path.join(eg, g1))
            check(sorted(a) == sorted(e) and len(a) > 0, '%s: the same %d gradients' % (name, len(a)))
            worst, where = 0.0, ''
            for k in a:
                scale = max(max(abs(v) for v in a[k]), 1e-30)
                d = max(abs(x - y) for x, y in zip(a[k], e.get(k, []))) / scale if k in e else 1
                if d > worst:
                    worst, where = d, k
            check(worst <= (1e-4 if tol < 1e-4 else 2e-2), '%s: step-1 gradients, worst difference %.2e of the tensor\'s '
                  'largest (%s)' % (name, worst, where or '-'))
        if DEVICE == 'cuda-emulated':
            mpi_cases(wd)
    return summary()


if __name__ == '__main__':
    sys.exit(main())
