"""tally.py - the PASS/FAIL lines and the count the training scripts of tests/train share.

    from tally import check, summary
    check(cond, 'what was checked')     # prints PASS or FAIL and the text; returns cond
    sys.exit(summary())                 # prints 'N passed, M failed'; 1 when any failed
"""
counts = {'passed': 0, 'failed': 0}


def check(cond, what):
    print(('PASS ' if cond else 'FAIL ') + what, flush=True)
    counts['passed' if cond else 'failed'] += 1
    return cond


def summary():
    print('%d passed, %d failed' % (counts['passed'], counts['failed']))
    return 1 if counts['failed'] else 0
