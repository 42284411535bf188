#!/usr/bin/env python3
# Per-phase breakdown of a DTENSOR_HARNESS_TRACE file (NOTE: [Harness trace] in dtensor/comm/trace.h):
# medians over the tests in it (the first, a warm-up, left out), in ms since each test began.
#   DTENSOR_HARNESS_TRACE=/tmp/t build/benchmarks/harness_overhead_benchmark --benchmark_filter=BM_ForkServer/4
#   python3 benchmarks/harness_phases.py /tmp/t            # fork: tests begin at set.start
#   python3 benchmarks/harness_phases.py /tmp/t run.start  # pool: tests begin at run.start
import sys, statistics, collections
ev = []
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) < 4: continue
    ev.append((int(p[0]), int(p[1]), int(p[2]), p[3]))
ev.sort()
# split into tests at each set.start (fork) or run.start (pool)
start_name = sys.argv[2] if len(sys.argv) > 2 else 'set.start'
tests = []
cur = None
for e in ev:
    if e[3] == start_name:
        cur = []
        tests.append(cur)
    if cur is not None: cur.append(e)
def first(t, name, rank=None):
    for e in t:
        if e[3] == name and (rank is None or e[2] == rank): return e[0]
    return None
def allr(t, name):
    return {e[2]: e[0] for e in t if e[3] == name}
rows = collections.defaultdict(list)
for t in tests[1:]:  # first test is a warm-up
    t0 = t[0][0]
    def ms(x): return (x - t0) / 1e6
    marks = {}
    for name in ['set.store','run.start','test.ran','set.end']:
        v = first(t, name)
        if v: marks[name] = ms(v)
    for name in ['set.launched','rank.start','rank.run','rank.store','group.connect','group.connected','group.ready','rank.body','rank.body_done','rank.barrier_done','rank.exit','run.result','run.exited']:
        d = allr(t, name)
        if d:
            marks[name+'.first'] = ms(min(d.values()))
            marks[name+'.last'] = ms(max(d.values()))
    end = max(e[0] for e in t)
    marks['end'] = ms(end)
    for k, v in marks.items(): rows[k].append(v)
print(f"{len(tests)-1} tests; ms since {start_name} (median over tests)")
for k, v in sorted(rows.items(), key=lambda kv: statistics.median(kv[1])):
    print(f"  {k:28s} {statistics.median(v):8.2f}   (min {min(v):7.2f} max {max(v):7.2f})")
