#!/bin/bash
# The files the collector opens per process started (docs/performance.md):
# `record -a` while 100 `sh -c 'ls /'` run; bpftrace counts the collector's
# openat calls, the /proc/PID/cgroup ones apart.
# usage: docs/scripts/opens-per-process.sh path/to/vmtrace
set -u
bin=$1; d=$(mktemp -d)
"$bin" record -a --out "$d/out" > /dev/null 2> "$d/err" &
vp=$!; sleep 3
bpftrace -e "tracepoint:syscalls:sys_enter_openat /pid == $vp/ { @[str(args->filename)] = count(); }" > "$d/bt" 2>&1 &
bp=$!; sleep 3
for _ in $(seq 100); do sh -c 'ls / >/dev/null'; done
sleep 1; kill -INT $bp; wait $bp 2>/dev/null; kill -INT $vp; wait $vp
sum() { grep "$1" "$d/bt" | awk -F': ' '{s+=$2} END {print s+0}'; }
echo "cgroup opens: $(sum '/cgroup'), all opens: $(sum '^@')"
rm -rf "$d"
