#!/bin/bash
# `record -a` beside a fixed amount of churn: N rounds of the loop of
# churn-serve.sh (/bin/true, `sh -c 'ls /'`, a Python interpreter with a few
# imports), so that two builds or two option sets do the same work. Prints
# the collector's CPU over the loop (clock ticks, 1/100 s), the loop's wall
# time and the collector's VmHWM.
# usage: docs/scripts/churn-fixed.sh BIN ROUNDS [record options]
bin=$1; n=$2; shift 2
out=$(mktemp -d)
$bin record -a "$@" -o "$out" > "$out/log" 2>&1 &
vp=$!
sleep 4
c0=$(awk '{print $14+$15}' /proc/$vp/stat); t0=$(date +%s.%N)
for _ in $(seq "$n"); do /bin/true; sh -c 'ls /' >/dev/null; python3 -c 'import json, ssl, sqlite3, decimal'; done
sleep 3
c1=$(awk '{print $14+$15}' /proc/$vp/stat); t1=$(date +%s.%N)
hwm=$(awk '/VmHWM/{print $2}' /proc/$vp/status)
kill -INT $vp; wait $vp
echo "$(basename "$bin") $*: $((c1 - c0)) ticks over $(echo "$t1 - $t0" | bc | cut -c1-5) s, VmHWM $hwm kB"
rm -rf "$out"
