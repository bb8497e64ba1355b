#!/usr/bin/env python3
"""Mixture-of-experts plans held to closed forms (docs/moe.md), from what `ptc --emit plan`
prints and what `--emit program` runs:

  - expert memory per rank: the experts' parameters split over ep and tp (4 bytes an element),
    their gradients alike, AdamW's two moments split further over dp under ZeRO-1;
  - the dispatch buffers: a rank of n tokens sends at most min(n K, E min(n, C)) rows and receives
    at most min(El min(G, C), G min(K, El)) rows, El = E / ep, G = n ep, C the capacity
    (ceil(c K N / E) on the decimal c, at most N; N without a capacity);
  - all-to-all bytes per layer with balanced routing: 4 exchanges (two forward, two backward) of
    the rows a rank dispatches, (ep - 1) / ep of them to other ranks, d floats a row;
  - the count exchange: all-gathers of the per-row counts i32[rows, K, E] over dp (rows of one ep
    block) and ep (all rows), and of the kept counts i32[E] over ep;
  - expert gradients are reduced over dp only, every other gradient over dp and ep in one group;
  - ZeRO shards the experts' state over dp and everything else's over dp and ep (ep is data
    parallel for it): per rank, stage z >= 1 the optimizer state, z >= 2 the gradients, z = 3
    the parameters, of X expert and P - X other elements, (X / (ep dp) and (P - X) / (ep dp));
    the shards over both are gathered (z >= 1) and scattered (z >= 2) by one collective over
    the group dp+ep, never one per axis in a row, and the plan's bytes by group add up;
  - invariants: more ep never gives a rank more expert memory; a capacity never reserves more
    dispatch rows than dropless;
  - measured all-to-all bytes (the runner's step log): with 2 experts and top 2 on ep=2 every
    token sends one row to the other rank, so each step sends exactly the plan's balanced
    figure; with top 1 of 4 experts it sends whole rows, at most the plan's bound, and its
    ratio to the plan is on the step line. The log's figures over every rank (gathered each
    step) hold the same on dp=2,ep=2: the planned sum is the ranks' count times rank 0's
    (their programs send alike), the exact case sends it, the other whole rows, at most the
    ranks' bound, and the rank that sends the most against its plan sends at least the mean
    ratio and rank 0's.

Usage: moe_plan.py PTC SOURCE_DIR   (exit 0 all hold, 1 otherwise)
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from fractions import Fraction

failures = 0


def check(ok, what):
    global failures
    print('%s %s' % ('ok  ' if ok else 'FAIL', what))
    failures += not ok


def ptc(*args):
    r = subprocess.run([PTC] + list(args), capture_output=True, text=True)
    if r.returncode:
        sys.exit('moe_plan.py: ptc %s failed:\n%s' % (' '.join(args), r.stderr))
    return r.stdout


def number(text, pattern):
    m = re.search(pattern, text)
    if not m:
        sys.exit('moe_plan.py: no match for %r in\n%s' % (pattern, text))
    return m.groups()


def to_bytes(value, unit):
    return float(value) * {'B': 1, 'KiB': 1 << 10, 'MiB': 1 << 20, 'GiB': 1 << 30}[unit]


def capacity(c, n, k, e):
    return n if c == 0 else min(n, math.ceil(Fraction(repr(float(c))) * k * n / e))


# moe_tiny: vocab 256, d 64, 2 layers, 4 experts, top 2, expert hidden 128 (swiglu: w_up 256
# columns), batch 8 x 32
TINY = dict(d=64, layers=2, E=4, K=2, f=128, B=8, S=32)


def expected(m, dp, ep, tp, cap, zero):
    d, E, K, f, L = m['d'], m['E'], m['K'], m['f'], m['layers']
    expert_elems = L * E * (d * 2 * f + f * d)
    params = expert_elems * 4 / (ep * tp)
    optim = 2 * params / (dp if zero >= 1 else 1)
    N = m['B'] * m['S']
    n = N // (dp * ep)
    C = capacity(cap, N, K, E)
    el, G = E // ep, n * ep
    send = min(n * K, E * min(n, C))
    recv = min(el * min(G, C), G * min(K, el))
    a2a = 4 * send * d * 4 * (ep - 1) / ep
    # dp gathers the rows of one ep block (B / ep of them), then ep all of them
    counts = ((m['B'] // ep) * K * E * 4 * (dp - 1) / dp + m['B'] * K * E * 4 * (ep - 1) / ep +
              ep * E * 4 * (ep - 1) / ep)
    return dict(params=params, grads=params, optim=optim, send=send, recv=recv, a2a=a2a,
                counts=counts, row=d * 4)


def plan_figures(text):
    got = {}
    for key, name in (('params', 'parameters'), ('grads', 'gradients'),
                      ('optim', 'optimizer state')):
        v, u = number(text, r'expert memory .*%s ([\d.]+) (B|KiB|MiB|GiB)' % name)
        got[key] = to_bytes(v, u)
    m = re.search(r'dispatch\s+send (\d+) rows .*receive (\d+) rows', text)
    if m:
        got['send'], got['recv'] = int(m.group(1)), int(m.group(2))
        v, u = number(text, r'all-to-all\s+4 per step: ([\d.]+) (B|KiB|MiB|GiB) sent')
        got['a2a'] = to_bytes(v, u)
    m = re.search(r'count exchange\s+([\d.]+) (B|KiB|MiB|GiB) sent', text)
    got['counts'] = to_bytes(*m.groups()) if m else 0
    return got


def near(a, b):
    return abs(a - b) <= 0.006 * max(abs(b), 1)  # the summary prints 3 significant digits


def meshes():
    for dp in (1, 2):
        for ep in (1, 2, 4):
            for tp in (1, 2):
                if dp * ep * tp > 1:
                    for cap in (0, 1.0, 0.5):
                        yield dp, ep, tp, cap


def measured_all_to_all(tiny):
    with tempfile.TemporaryDirectory() as work:
        for E, K, exact, mesh, n in ((2, 2, True, 'ep=2', 2), (4, 1, False, 'ep=2', 2),
                                     (2, 2, True, 'dp=2,ep=2', 4),
                                     (4, 1, False, 'dp=2,ep=2', 4)):
            exe, log = os.path.join(work, 'moe%d%d' % (E, K)), os.path.join(work, 'log.jsonl')
            args = ['-D', 'experts=%d' % E, '-D', 'top_k=%d' % K, '-D', 'batch=4', '-D', 'seq=16',
                    '--mesh', mesh, tiny]
            most = to_bytes(*number(ptc('--emit', 'plan', '--summary', *args),
                                    r'sent with balanced routing, at most ([\d.]+) (\w+)'))
            ptc('-o', exe, *args)
            r = subprocess.run([exe, '--steps', '3', '--log', log], capture_output=True,
                               text=True)
            recs = [json.loads(line) for line in open(log)] if r.returncode == 0 else []
            sent = [x.get('a2a_bytes') for x in recs if 'loss' in x]
            plan = [x.get('a2a_planned_bytes') for x in recs if 'loss' in x]
            tag = 'moe_tiny top %d of %d experts on %s' % (K, E, mesh)
            check(len(sent) == 3 and None not in sent and 'all-to-all' in r.stdout,
                  '%s: the step log has the measured all-to-all bytes (%s)' % (tag, sent))
            if len(sent) != 3 or None in sent:
                continue
            if exact:
                check(sent == plan, '%s: every step sends the balanced figure, %s bytes (plan %s)'
                      % (tag, sent, plan))
            else:
                row = 4 * TINY['d']
                check(all(0 < s <= most and s % row == 0 for s in sent) and sent != plan,
                      '%s: whole rows of %d bytes, at most the plan\'s %d: %s (balanced %d)'
                      % (tag, row, most, sent, plan[0]))
            steps = [x for x in recs if 'loss' in x]
            alls = [x.get('a2a_bytes_all') for x in steps]
            plan_all = [x.get('a2a_planned_bytes_all') for x in steps]
            check(None not in alls and plan_all == [n * p for p in plan],
                  '%s: the planned figure over the %d ranks is %d times rank 0\'s: %s'
                  % (tag, n, n, plan_all))
            if None in alls or None in plan_all:
                continue
            worst = [(x['a2a_most_rank'], x['a2a_most']) for x in steps]
            mean = [a / p for a, p in zip(alls, plan_all)]
            own = [a / p for a, p in zip(sent, plan)]
            check(all(0 <= r < n and w >= m - 1e-6 and w >= o - 1e-6
                      for (r, w), m, o in zip(worst, mean, own)),
                  '%s: the rank that sends the most against its plan (%s) sends at least the '
                  'mean ratio %s and rank 0\'s %s' % (tag, worst, mean, own))
            if exact:
                check(alls == plan_all and all(w == 1 for _, w in worst),
                      '%s: every rank sends the balanced figure: %s (plan %s)'
                      % (tag, alls, plan_all))
            else:
                row = 4 * TINY['d']
                check(all(0 < a <= n * most and a % row == 0 and a > s
                          for a, s in zip(alls, sent)),
                      '%s: all ranks send whole rows, at most %d each, more than rank 0 '
                      'alone: %s' % (tag, most, alls))


def zero_collectives(tiny, dp, ep, zero):
    """ZeRO's shards over dp and ep are gathered, and its gradients scattered, by one collective
    over the group dp+ep, never by one over dp and then one over ep of its result (or the
    reverse)."""
    tag = 'moe_tiny dp=%d,ep=%d zero=%d' % (dp, ep, zero)
    prog = ptc('--mesh', 'dp=%d,ep=%d' % (dp, ep), '--zero', str(zero), '--emit', 'program',
               tiny)
    made = {}  # buffer -> (kind, group) of the collective that wrote it
    chained, both = [], {'allgather': 0, 'reduce_scatter': 0}
    for m in re.finditer(r'= (allgather|reduce_scatter) (b\d+) -> (b\d+) \{group=([\w+]+)',
                         prog):
        kind, src, dst, group = m.groups()
        prev = made.get(src)
        if prev and prev[0] == kind and {prev[1], group} == {'dp', 'ep'}:
            chained.append('%s %s -> %s' % (kind, prev[1], group))
        made[dst] = (kind, group)
        both[kind] += group == 'dp+ep'
    check(not chained, '%s: no ZeRO collective over dp then ep (or ep then dp): %s'
          % (tag, chained[:3]))
    want = {'allgather': zero >= 1, 'reduce_scatter': zero >= 2}
    check(all((both[k] > 0) == want[k] for k in want),
          '%s: allgathers and reduce-scatters over dp+ep: %s' % (tag, both))
    comm = json.loads(ptc('--mesh', 'dp=%d,ep=%d' % (dp, ep), '--zero', str(zero), '--emit',
                          'plan-json', tiny))['programs'][0]['communication']
    check(sum(comm['by_group'].values()) == comm['bytes'] and comm['by_group'].get('dp+ep'),
          '%s: the bytes by group (%s) add up to the %d sent' % (tag, comm['by_group'],
                                                                 comm['bytes']))


def main():
    global PTC
    PTC, src = sys.argv[1], sys.argv[2]
    tiny = src + '/examples/moe_tiny.ptm'
    memory = {}
    for dp, ep, tp, cap in meshes():
        zero = 1 if dp > 1 else 0
        mesh = ','.join('%s=%d' % (a, n) for a, n in (('dp', dp), ('ep', ep), ('tp', tp))
                        if n > 1)
        tag = 'moe_tiny --mesh %s --zero %d capacity %g' % (mesh, zero, cap)
        text = ptc('--mesh', mesh, '--zero', str(zero), '-D', 'capacity_factor=%r' % cap,
                   '--emit', 'plan', '--summary', tiny)
        want, got = expected(TINY, dp, ep, tp, cap, zero), plan_figures(text)
        for key in ('params', 'grads', 'optim', 'counts'):
            check(near(got[key], want[key]), '%s: %s %g, closed form %g' %
                  (tag, key, got[key], want[key]))
        if ep > 1:
            for key in ('send', 'recv', 'a2a'):
                check(near(got[key], want[key]), '%s: %s %g, closed form %g' %
                      (tag, key, got[key], want[key]))
        else:
            check('send' not in got, '%s: no dispatch buffers without ep' % tag)
        memory[(dp, ep, tp, cap)] = (got['params'] + got['grads'] + got['optim'],
                                     got.get('recv', 0))
    for (dp, ep, tp, cap), (mem, recv) in memory.items():
        if (dp, 2 * ep, tp, cap) in memory:
            check(memory[(dp, 2 * ep, tp, cap)][0] <= mem,
                  'dp=%d tp=%d capacity %g: ep=%d holds no more expert memory than ep=%d' %
                  (dp, tp, cap, 2 * ep, ep))
        if cap and (dp, ep, tp, 0) in memory:
            check(recv <= memory[(dp, ep, tp, 0)][1],
                  'dp=%d ep=%d tp=%d: capacity %g reserves no more rows than dropless' %
                  (dp, ep, tp, cap))

    # who reduces what: expert gradients over dp only, the rest over dp+ep in one group
    prog = ptc('--mesh', 'dp=2,ep=2', '--emit', 'program', tiny)
    expert_count = TINY['E'] // 2 * TINY['d'] * 2 * TINY['f']  # a local w_up
    groups = {}
    for m in re.finditer(r'allreduce \S+ -> \S+ \{group=([\w+]+), reduce=sum, count=(\d+)\} '
                         r'backward', prog):
        groups.setdefault(m.group(1), []).append(int(m.group(2)))
    check(expert_count in groups.get('dp', []),
          'dp=2,ep=2: the w_up gradients (%d elements) are reduced over dp' % expert_count)
    check(all(c != expert_count for c in groups.get('dp+ep', [])) and 'dp+ep' in groups,
          'dp=2,ep=2: the other gradients are reduced over dp+ep in one group')
    check('ep' not in groups or all(c == 1 for c in groups['ep']),
          'dp=2,ep=2: nothing but the gradient norm of the expert shards is reduced over ep '
          'alone (%s)' % groups.get('ep'))

    # ZeRO over dp and ep: 4 bytes an element, AdamW's two moments
    total = int(number(ptc('--emit', 'plan', '--summary', tiny), r'([\d,]+) parameters')[0]
                .replace(',', ''))
    experts = TINY['layers'] * TINY['E'] * 3 * TINY['d'] * TINY['f']
    for dp, ep in ((1, 2), (2, 2), (1, 4), (2, 4)):
        for zero in (1, 2, 3):
            text = ptc('--mesh', 'dp=%d,ep=%d' % (dp, ep), '--zero', str(zero), '--emit', 'plan',
                       '--summary', tiny)
            got = [int(number(text, r'\n\s+%s\s+([\d,]+)' % k)[0].replace(',', ''))
                   for k in ('parameters', 'gradients', 'optimizer state')]
            want = [4 * (experts / (ep * (dp if zero >= z else 1)) +
                         (total - experts) / (dp * ep if zero >= z else 1)) * (2 if z == 1 else 1)
                    for z in (3, 2, 1)]
            check(got == want, 'moe_tiny dp=%d,ep=%d zero=%d: parameters, gradients, optimizer '
                  'state %s a rank, closed form %s' % (dp, ep, zero, got, want))
            if dp > 1:
                zero_collectives(tiny, dp, ep, zero)

    # Mixtral on dp=2,ep=4: the Done-when plan shows the all-to-alls and the expert shards
    text = ptc('--mesh', 'dp=2,ep=4', '--emit', 'plan', src + '/examples/moe.ptm')
    check(re.search(r'layers\.0\.w_up\s+\[8,4096,28672\]\s+dp:R ep:S0\s+-> \[2,4096,28672\]',
                    text) is not None, 'moe.ptm dp=2,ep=4: w_up split over ep, 2 experts a rank')
    check(len(re.findall(r'= all_to_all_v ', text)) == 4 * 32,
          'moe.ptm dp=2,ep=4: 4 all_to_all_v per layer in the program')
    measured_all_to_all(tiny)
    print('moe plans: %d failed' % failures)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
