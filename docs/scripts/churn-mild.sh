#!/bin/bash
# The collector beside a light shell loop (docs/performance.md): `record -a`
# while a loop starts /bin/true, `sh -c 'ls /'`, `python3 -c 'import json'`
# and a `sleep NAP` (~1.5 rounds a second with NAP 0.5: ~74 processes a second
# where `python3` is pyenv's shim, 42 processes per `python3 -c`) for SECS seconds;
# prints the collector's CPU (% of a core) over the loop and its memory.
# usage: [VMTRACE=path/to/vmtrace] docs/scripts/churn-mild.sh SECS NAP [record options]
secs=$1; nap=$2; shift 2
bin=${VMTRACE:-$(dirname "$0")/../../target/release/vmtrace}
out=$(mktemp -d)
$bin record -a -o $out/rec "$@" > /dev/null 2> $out/stderr &
vp=$!
sleep 3
c0=$(awk '{print $14+$15}' /proc/$vp/stat); t0=$(date +%s.%N); n=0
end=$(( $(date +%s) + secs ))
while [ $(date +%s) -lt $end ]; do /bin/true; sh -c 'ls /' >/dev/null; python3 -c 'import json'; n=$((n+1)); sleep $nap; done
c1=$(awk '{print $14+$15}' /proc/$vp/stat); t1=$(date +%s.%N)
mem=$(awk '/VmHWM|VmRSS|RssAnon|RssFile/{printf "%s %s ", $1, $2}' /proc/$vp/status)
kill -INT $vp; wait $vp
lost=$(python3 -c "import json; print(json.load(open('$out/rec/summary.json'))['lost_events'])" 2>/dev/null)
echo "rounds $n in $(echo "$t1 - $t0" | bc) s; collector cpu $(echo "scale=1; ($c1 - $c0) / ($t1 - $t0)" | bc)% of a core; $mem; lost $lost"
rm -rf $out
