#!/usr/bin/env python3
"""The automatic planner (`ptc --auto N`) and the device-memory check, held to the compiler's own
plans, compiled one by one from the command line:

  - --device-memory: a plan whose fullest rank allocates exactly the limit compiles, one byte
    less is refused (exit 1) with the rank and its bytes by region;
  - every row the planner prints, compiled by hand with the flags it stands for, gives the same
    simulated step (`--emit trace`) and the same fullest rank (`--emit plan-json`, the arenas'
    sum); a row fits exactly when those bytes are within the limit;
  - the choice is the fastest that fits among every plan of a grid wider than the planner's
    search (every mesh of 4 ranks, ZeRO 0-3, sequence parallelism on and off, every schedule,
    GPipe too, 1, 2 and 4 microbatches, every recompute policy), each compiled by hand under the
    same --device-memory: no plan of the grid that fits is faster;
  - the same report on one core as with a worker per core;
  - with no plan that fits: exit 1, the least memory any candidate needs; bad flags: exit 2;
  - the chosen plan trains: `ptc --auto 4 -o` gives the single device's losses.

Usage: auto_plan.py PTC SOURCE_DIR   (exit 0 all hold, 1 otherwise)
"""
import concurrent.futures
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile

failures = 0


def check(ok, what):
    global failures
    print('%s %s' % ('ok  ' if ok else 'FAIL', what))
    failures += not ok


def run(*args):
    return subprocess.run([PTC] + list(args), capture_output=True, text=True)


def human(b):
    """ptc_human_bytes"""
    if b < 1024:
        return '%d B' % b
    for unit, scale in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if b >= scale:
            return '%.2f %s' % (b / scale, unit)


def fullest(flags):
    r = run(*flags, '--emit', 'plan-json', MODEL)
    if r.returncode:
        return None
    return max(sum(p['memory_bytes']['arenas'].values()) for p in json.loads(r.stdout)['programs'])


def step_ms(flags, extra=()):
    """The simulated step of a plan, or None when ptc refuses it (under extra's limit too)."""
    r = run(*flags, *extra, '--emit', 'trace', MODEL)
    if r.returncode:
        return None
    return float(re.search(r'\): ([0-9.]+) ms"', r.stdout).group(1))


ROW = re.compile(r'^\s+([0-9.]+)\s+([0-9.]+ (?:B|KiB|MiB|GiB))\s+(\S+)\s+(\d)\s+(on|off)\s+(\S+)'
                 r'\s+(\d+)\s+(\w+)(.*)$')


def row_flags(m):
    mesh, zero, sp, sched, micro, rec = m.group(3, 4, 5, 6, 7, 8)
    flags = [] if mesh == '1' else ['--mesh', mesh]
    flags += ['--zero', zero, '--microbatches', micro, '--recompute', rec]
    if sp == 'on':
        flags.append('--seq-parallel')
    if sched != '-':
        flags += ['--pp-schedule', sched]
    return flags


def planner_rows(out):
    return [m for m in map(ROW.match, out.splitlines()) if m]


def main():
    global PTC, MODEL
    PTC, src = sys.argv[1], sys.argv[2]
    MODEL = os.path.join(src, 'examples', 'gpt2_tiny.ptm')

    # --device-memory: to the byte
    f = fullest(['--mesh', 'dp=2'])
    ok = run('--mesh', 'dp=2', '--device-memory', str(f), '--emit', 'plan', '--summary', MODEL)
    bad = run('--mesh', 'dp=2', '--device-memory', str(f - 1), '--emit', 'plan', MODEL)
    check(ok.returncode == 0 and bad.returncode == 1 and not bad.stdout,
          '--device-memory %d passes, %d is refused (exit %d)' % (f, f - 1, bad.returncode))
    check(re.search(r'rank 0 \(and 1 more like it\) plans %s: parameters ' % re.escape(human(f)),
                    bad.stderr) is not None, 'the refusal names the rank and its bytes: %s'
          % bad.stderr.strip().splitlines()[0])

    r = run('--mesh', 'dp=2', '--device-memory', str(2 * f), '--emit', 'plan', '--summary', MODEL)
    check('allocated at start, 50.0%% of --device-memory %s' % human(2 * f) in r.stdout,
          '--emit plan says the share of --device-memory a rank plans')

    # bad flags
    for args in (['--auto', '4', '--mesh', 'dp=4'], ['--auto', '0'], ['--device-memory', '1QB'],
                 ['--device-memory', '-5'], ['--cost-model', 'a100'],
                 ['--cost-model', 'flops=0'], ['--auto', '2', '--zero', '1']):
        r = run(*args, MODEL)
        check(r.returncode == 2 and 'ptc: error: ' in r.stderr,
              '%s: exit 2 (%s)' % (' '.join(args), r.stderr.splitlines()[0] if r.stderr else ''))

    # the planner's rows are the compiler's plans; the choice is the grid's fastest that fits
    limit = 1200 * 1024
    r = run('--auto', '4', '--device-memory', str(limit), MODEL)
    check(r.returncode == 0, 'ptc --auto 4 --device-memory %d exits 0' % limit)
    rows = planner_rows(r.stdout)
    chosen = re.search(r'^chosen:(.*)$', r.stdout, re.M)
    check(len(rows) >= 2 and chosen is not None and rows[0].group(9).strip() == '<- chosen',
          'the planner prints its candidates (%d rows) and the chosen flags:%s'
          % (len(rows), chosen.group(1) if chosen else ''))
    for m in rows:
        flags = row_flags(m)
        ms, b = step_ms(flags), fullest(flags)
        over = 'over the limit' in m.group(9)
        check(ms is not None and abs(ms - float(m.group(1))) < 5e-4 and human(b) == m.group(2)
              and (b > limit) == over,
              '%s: %s ms %s by hand, the planner %s ms %s' % (' '.join(flags), ms, human(b or 0),
                                                             m.group(1), m.group(2)))
    best = float(rows[0].group(1))
    again = step_ms(chosen.group(1).split(), ['--device-memory', str(limit)])
    check(again is not None and abs(again - best) < 5e-4,
          'the chosen flags compile under the limit to the same step (%s ms)' % again)

    grid = []
    for pp, dp, tp in ((1, 4, 1), (1, 2, 2), (1, 1, 4), (2, 2, 1), (2, 1, 2), (4, 1, 1)):
        mesh = ','.join('%s=%d' % (a, n) for a, n in (('pp', pp), ('dp', dp), ('tp', tp)) if n > 1)
        scheds = ['gpipe', '1f1b', 'interleaved', 'zb-h1'] if pp > 1 else [None]
        for zero, sp, sched, micro, rec in itertools.product(
                range(4 if dp > 1 else 1), (False, True) if tp > 1 else (False,), scheds,
                (1, 2, 4), ('none', 'selective', 'full')):
            flags = ['--mesh', mesh, '--zero', str(zero), '--microbatches', str(micro),
                     '--recompute', rec] + (['--seq-parallel'] if sp else [])
            grid.append(flags + (['--pp-schedule', sched] if sched else []))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        times = list(pool.map(lambda fl: step_ms(fl, ['--device-memory', str(limit)]), grid))
    fits = [(t, fl) for t, fl in zip(times, grid) if t is not None]
    t, fl = min(fits)
    check(best <= t + 5e-4, 'no plan of the grid that fits is faster than the choice: %d of %d '
          'fit, the fastest %s ms (%s), the planner %s ms' % (len(fits), len(grid), t,
                                                              ' '.join(fl), best))

    # without a limit: the grid's fastest
    r = run('--auto', '4', MODEL)
    rows = planner_rows(r.stdout)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        times = list(pool.map(step_ms, grid))
    t, fl = min((t, fl) for t, fl in zip(times, grid) if t is not None)
    check(r.returncode == 0 and rows and float(rows[0].group(1)) <= t + 5e-4,
          'no limit: the choice %s ms, the grid\'s fastest %s ms (%s)'
          % (rows[0].group(1) if rows else None, t, ' '.join(fl)))

    # the workers (one process per core) change nothing: one core prints the same
    one = subprocess.run([PTC, '--auto', '4', '--device-memory', str(limit), MODEL],
                         capture_output=True, text=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
    again = run('--auto', '4', '--device-memory', str(limit), MODEL)
    check(one.returncode == 0 and one.stdout == again.stdout,
          'on one core (no workers) the planner prints what it prints on %d'
          % len(os.sched_getaffinity(0)))

    # nothing fits
    r = run('--auto', '4', '--device-memory', '100KiB', MODEL)
    m = re.search(r'the least any candidate plans on its fullest rank is ([0-9.]+ \w+)', r.stderr)
    check(r.returncode == 1 and m is not None,
          '--device-memory 100KiB: exit %d, %s' % (r.returncode, m.group(0) if m else r.stderr))

    # a --emit keeps standard output to itself: the report goes to standard error
    r = run('--auto', '2', '--emit', 'plan-json', MODEL)
    notes = json.loads(r.stdout)['notes'] if r.returncode == 0 else ''
    check(r.returncode == 0 and json.loads(r.stdout)['ranks'] == 2 and 'chosen:' in r.stderr
          and notes.startswith('auto: --auto 2 chose --mesh '),
          '--auto 2 --emit plan-json: the JSON on stdout, the report on stderr, the choice in '
          'the plan\'s notes: %s' % notes.splitlines()[0] if notes else '')

    # the chosen plan trains like one device
    with tempfile.TemporaryDirectory() as tmp:
        losses = {}
        for tag, args in (('single', []), ('auto', ['--auto', '4', '--device-memory',
                                                    str(limit)])):
            exe, log = os.path.join(tmp, tag), os.path.join(tmp, tag + '.jsonl')
            r = run(*args, '-o', exe, MODEL)
            if r.returncode:
                check(False, '%s: ptc -o failed: %s' % (tag, r.stderr))
                continue
            t = subprocess.run([exe, '--steps', '5', '--quiet', '--log', log],
                               capture_output=True, text=True)
            losses[tag] = [json.loads(x)['loss'] for x in open(log) if '"loss"' in x] \
                if t.returncode == 0 else None
        a, b = losses.get('single'), losses.get('auto')
        check(a and b and len(a) == len(b) == 5
              and max(abs(x - y) for x, y in zip(a, b)) < 1e-4 * abs(a[0]),
              'the chosen plan trains 5 steps with the single device\'s losses (%s vs %s)'
              % (b, a))

    print('auto_plan: %s' % ('all hold' if not failures else '%d failed' % failures))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
