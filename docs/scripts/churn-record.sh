#!/bin/bash
# The collector under process churn (docs/performance.md): `record -a` while
# ROUNDS rounds of a shell loop start short processes; prints the collector's
# memory and CPU when the loop ends, the end step's peak and the processes seen.
# usage: [VMTRACE=path/to/vmtrace] docs/scripts/churn-record.sh OUTDIR ROUNDS [record options]
out=$1; rounds=$2; shift 2
bin=${VMTRACE:-$(dirname "$0")/../../target/release/vmtrace}
rm -rf $out $out.d; mkdir -p $out.d
$bin record -a -o $out "$@" > $out.d/stdout 2> $out.d/stderr &
vp=$!
sleep 3
t0=$(date +%s.%N)
( for i in $(seq $rounds); do /bin/true; sh -c 'ls /' >/dev/null; python3 -c 'import json, ssl, sqlite3, decimal'; done ) 
t1=$(date +%s.%N)
sleep 3
s=$(awk '/VmHWM|VmRSS|RssAnon|RssFile/{printf "%s %s ", $1, $2}' /proc/$vp/status)
c=$(awk '{print $14+$15}' /proc/$vp/stat)
kill -INT $vp; 
while kill -0 $vp 2>/dev/null; do h=$(awk '/VmHWM/{print $2}' /proc/$vp/status 2>/dev/null); [ -n "$h" ] && echo $h > $out.d/hwm; sleep 0.2; done
procs=$(python3 -c "
import json;s=json.load(open('$out/summary.json'))
f=s.get('folding') or {}
print(len(s['processes'])+ (f.get('processes') or 0))")
echo "loop $(echo "$t1 - $t0" | bc) s; at loop end: $s cpu_ticks=$c; end-step VmHWM $(cat $out.d/hwm); processes $procs"
