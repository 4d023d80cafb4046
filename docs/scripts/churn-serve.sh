#!/bin/bash
# `serve -a` beside the churn loop of docs/agent.md ("Cost as a node agent"):
# a shell loop starting /bin/true, `sh -c 'ls /'` and a Python interpreter
# with a few imports, back to back, for SECS seconds; /metrics and
# /debug/pprof/faults fetched every 15 s. Prints, every 15 s, the agent's
# RssAnon and VmHWM and the series, then its CPU (% of a core) over the
# loop and the processes folded into "other".
# usage: [VMTRACE=path/to/vmtrace] docs/scripts/churn-serve.sh SECS [serve options]
secs=$1; shift
bin=${VMTRACE:-$(dirname "$0")/../../target/release/vmtrace}
port=$((20000 + RANDOM % 20000))
$bin serve -a --listen 127.0.0.1:$port "$@" > /dev/null 2> /tmp/churn-serve.$$.err &
vp=$!
sleep 3
( while :; do /bin/true; sh -c 'ls /' >/dev/null; python3 -c 'import json, ssl, sqlite3, decimal'; done ) &
lp=$!
c0=$(awk '{print $14+$15}' /proc/$vp/stat); t0=$(date +%s)
while [ $(( $(date +%s) - t0 )) -lt $secs ]; do
  sleep 15
  series=$(curl -s 127.0.0.1:$port/metrics | grep -cv '^#')
  curl -s 127.0.0.1:$port/debug/pprof/faults -o /dev/null
  echo "t=$(( $(date +%s) - t0 )) s: $(awk '/RssAnon|VmHWM/{printf "%s %s kB ", $1, $2}' /proc/$vp/status)series $series"
done
c1=$(awk '{print $14+$15}' /proc/$vp/stat); t1=$(date +%s)
kill $lp; wait $lp 2>/dev/null
folded=$(curl -s 127.0.0.1:$port/metrics | awk '/^vmtrace_folded_processes_total/{print $2}')
kill -INT $vp; wait $vp
echo "collector cpu $(( (c1 - c0) / (t1 - t0) ))% of a core over $((t1 - t0)) s; $folded processes folded into other"
rm -f /tmp/churn-serve.$$.err
