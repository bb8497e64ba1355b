#!/usr/bin/env python3
"""How well `ptc --auto` ranks plans: the simulated step (the cost model of --emit trace and
--auto) against the measured one, for every plan of a model on this machine's ranks.

Every plan of N ranks that the planner's grid holds (each mesh over pp, dp, tp; ZeRO 0-3; SP on
and off; the pipeline schedules at 2, 4 and 8 microbatches; recompute none and full) is compiled,
simulated with --cost-model (default cpu) and trained for --steps steps on the CPU backend (ranks
as threads); the median step time of the steps after the first two, median over --rounds
interleaved rounds, is the measured one. Prints
the plans by measured time with the simulated one beside it, the rank correlation between the
two (Spearman's), where the planner's choice lands among the measured, and how much slower it is
than the measured best. Writes bench/results/auto_plan_<date>.md with the command.

    python3 bench/auto_plan.py build/tools/ptc [--devices 2] [--steps 8] [--rounds 3]
        [--threads T] [--cost-model cpu] [-D NAME=VALUE ...] [--model examples/gpt2.ptm]

The cost model gives every rank a device of its own; --threads 1 gives every rank thread one
core of the pool (2 ranks on 2 cores), the nearest this machine comes to that.

A benchmark: it never fails on what it measures.
"""
import argparse
import datetime
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile


def ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    den = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return num / den if den else float('nan')


def meshes(n):
    for pp in range(1, n + 1):
        for tp in range(1, n // pp + 1):
            if n % pp == 0 and (n // pp) % tp == 0:
                yield pp, n // pp // tp, tp


def grid(n):
    for pp, dp, tp in meshes(n):
        mesh = ','.join('%s=%d' % (a, k) for a, k in (('pp', pp), ('dp', dp), ('tp', tp)) if k > 1)
        base = ['--mesh', mesh] if mesh else []
        scheds = [('--pp-schedule', s) for s in ('gpipe', '1f1b', 'interleaved', 'zb-h1')] \
            if pp > 1 else [()]
        micros = (2, 4, 8) if pp > 1 else (1,)
        for zero, sp, sched, m, rec in itertools.product(
                range(4 if dp > 1 else 1), (False, True) if tp > 1 else (False,), scheds, micros,
                ('none', 'full')):
            yield base + ['--zero', str(zero), '--microbatches', str(m), '--recompute', rec] + \
                (['--seq-parallel'] if sp else []) + list(sched)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('ptc')
    ap.add_argument('--devices', type=int, default=2)
    ap.add_argument('--steps', type=int, default=8)
    ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--threads', type=int, default=0,
                    help='the executable\'s --threads (default: its own, every core)')
    ap.add_argument('--cost-model', default='cpu')
    ap.add_argument('--model', default='examples/gpt2.ptm')
    ap.add_argument('-D', action='append', default=[])
    a = ap.parse_args()
    if not a.D and a.model == 'examples/gpt2.ptm':
        a.D = ['vocab=4096', 'ctx=128', 'd=256', 'heads=4', 'layers=4', 'batch=8', 'seq=128']
    defs = [x for d in a.D for x in ('-D', d)]
    cm = ['--cost-model', a.cost_model]
    plans = []
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, 'log.jsonl')
        for flags in grid(a.devices):
            t = subprocess.run([a.ptc, *defs, *cm, *flags, '--emit', 'trace', a.model],
                               capture_output=True, text=True)
            exe = os.path.join(tmp, 'p%d' % len(plans))
            if t.returncode or subprocess.run([a.ptc, *defs, *flags, '-o', exe, a.model],
                                              capture_output=True).returncode:
                continue
            sim = float(re.search(r'\): ([0-9.]+) ms"', t.stdout).group(1))
            plans.append({'flags': ' '.join(flags), 'sim': sim, 'exe': exe, 'ms': []})
        # rounds interleaved: a slow minute of the machine falls on every plan alike
        threads = ['--threads', str(a.threads)] if a.threads else []
        for rnd in range(a.rounds):
            for p in plans:
                r = subprocess.run([p['exe'], '--steps', str(a.steps), '--quiet', '--log', log,
                                    *threads], capture_output=True, text=True)
                if r.returncode:
                    print('failed: %s\n%s' % (p['flags'], r.stderr), file=sys.stderr)
                    continue
                ms = [json.loads(x)['step_ms'] for x in open(log) if '"step_ms"' in x][2:]
                p['ms'].append(statistics.median(ms))
                print('round %d: %10.2f ms measured %10.3f ms simulated  %s'
                      % (rnd + 1, p['ms'][-1], p['sim'], p['flags']), flush=True)
        rows = [(statistics.median(p['ms']), p['sim'], p['flags']) for p in plans if p['ms']]
        auto = subprocess.run([a.ptc, *defs, *cm, '--auto', str(a.devices), a.model],
                              capture_output=True, text=True)
    chosen = re.search(r'^chosen:(.*)$', auto.stdout, re.M)
    chosen_flags = chosen.group(1).split() if chosen else []

    def canon(flags):
        """flags as a dict, the defaults spelled out"""
        d = {'--mesh': '', '--zero': '0', '--microbatches': '1', '--recompute': 'none',
             '--seq-parallel': '', '--pp-schedule': '1f1b'}
        i = 0
        while i < len(flags):
            if flags[i] == '--seq-parallel':
                d[flags[i]], i = '1', i + 1
            else:
                d[flags[i]], i = flags[i + 1], i + 2
        return d

    rows.sort()
    rho = spearman([r[0] for r in rows], [r[1] for r in rows])
    pick = next((i for i, r in enumerate(rows) if canon(r[2].split()) == canon(chosen_flags)),
                None)
    stamp = datetime.datetime.now().strftime('%Y-%m-%d_%H%M%S')
    commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True,
                            text=True).stdout.strip()
    cmd = 'python3 bench/auto_plan.py ' + ' '.join(sys.argv[1:])
    out = ['# auto_plan: simulated against measured steps, %s' % stamp, '', '    ' + cmd, '',
           '- machine: `%s`, nproc %d; commit %s' % (' '.join(platform.uname()), os.cpu_count(),
                                                     commit),
           '- model: `%s %s`, %d ranks as threads (--threads %s), %d steps a plan (median of '
           'those after the first two), the median of %d interleaved rounds; --cost-model %s'
           % (a.model, ' '.join(defs), a.devices, a.threads or 'default', a.steps, a.rounds,
              a.cost_model),
           '- plans: %d; Spearman rank correlation, simulated against measured: %.3f'
           % (len(rows), rho)]
    if pick is not None:
        out.append('- the planner chose `%s`: measured %d of %d, %.2f ms against the measured '
                   'best %.2f ms (%.2fx)' % (' '.join(chosen_flags), pick + 1, len(rows),
                                            rows[pick][0], rows[0][0], rows[pick][0] / rows[0][0]))
    out += ['', '| measured ms | simulated ms | plan |', '|---:|---:|---|']
    out += ['| %.2f | %.3f | `%s` |' % r for r in rows]
    text = '\n'.join(out) + '\n'
    print(text)
    os.makedirs('bench/results', exist_ok=True)
    with open('bench/results/auto_plan_%s.md' % stamp, 'w') as f:
        f.write(text)


if __name__ == '__main__':
    main()
