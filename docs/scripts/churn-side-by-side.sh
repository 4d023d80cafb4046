#!/bin/bash
# Side by side: the churn load of docs/scripts/churn-live-stacks.sh, and two collectors
# (`record -a --duration D`), A = BIN_A with env ENV_A, B = BIN_B with env ENV_B, started together;
# RssAnon/VmHWM of both every 10 s to OUT/rss.
# usage: docs/scripts/churn-side-by-side.sh OUT D BIN_A "ENV_A" BIN_B "ENV_B"
# (docs/performance.md, "What the collector's heap holds under churn").
OUT=$1; D=$2; BA=$3; EA=$4; BB=$5; EB=$6
rm -rf "$OUT"; mkdir -p "$OUT"
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
sleep 1
env $EA RUST_LOG=vmtrace::weights=debug "$BA" record -a --duration $D -o "$OUT/a" 2>"$OUT/a.log" >"$OUT/a.out" &
A=$!
env $EB RUST_LOG=vmtrace::weights=debug "$BB" record -a --duration $D -o "$OUT/b" 2>"$OUT/b.log" >"$OUT/b.out" &
B=$!
echo "a $A $BA $EA / b $B $BB $EB" > "$OUT/rss"
T0=$(date +%s)
while kill -0 $A 2>/dev/null || kill -0 $B 2>/dev/null; do
  t=$(( $(date +%s) - T0 ))
  ra=$(awk '/RssAnon|VmHWM/{printf "%s %s ", $1, $2}' /proc/$A/status 2>/dev/null)
  rb=$(awk '/RssAnon|VmHWM/{printf "%s %s ", $1, $2}' /proc/$B/status 2>/dev/null)
  echo "$t A $ra B $rb load $(cut -d' ' -f1 /proc/loadavg) cpuA $(awk '{print $14+$15}' /proc/$A/stat 2>/dev/null) cpuB $(awk '{print $14+$15}' /proc/$B/stat 2>/dev/null)" >> "$OUT/rss"
  sleep 10
done
wait $A; echo "rc a $?" >> "$OUT/rss"; wait $B; echo "rc b $?" >> "$OUT/rss"
kill $CHURN $LONG
