# Sourced by churn-live-stacks.sh and churn-side-by-side.sh: starts their
# load in the background and sets CHURN and LONG to its two pids (stop it
# with `kill $CHURN $LONG`): the churn loop of docs/agent.md, and a
# long-lived Python process that makes new stacks all the time (a new
# function every ~25 ms, called 5 times, each call allocating 200 KB,
# mmap'd under MALLOC_MMAP_THRESHOLD_=65536: faults on every call).
( while :; do /bin/true; sh -c 'ls / >/dev/null'; python3 -c 'import json, ssl, sqlite3, decimal'; done ) >/dev/null 2>&1 &
CHURN=$!
MALLOC_MMAP_THRESHOLD_=65536 python3 -c '
import collections, time
keep = collections.deque(maxlen=200)
k = 0
while True:
    name = f"alloc_{k}"
    ns = {}
    exec(f"def {name}(n):\n    b = b\"x\" * n\n    return len(b)\n", ns)
    f = ns[name]
    keep.append(f)
    for _ in range(5):
        f(200_000)
    k += 1
    time.sleep(0.02)
' &
LONG=$!
