#!/bin/bash
# The end of a system-wide recording (docs/performance.md, "The end of a
# recording folded in slices"): `record -a` under /usr/bin/time beside the
# light loop of churn-mild.sh (NAP 0.5) for SECS seconds, then Ctrl-C.
# Prints the collector's memory just before the stop, its peak RSS over the
# whole run (the end included), how long the end took, and the summary's
# rows and folding.
# usage: [VMTRACE=path/to/vmtrace] docs/scripts/end-peak.sh SECS [record options]
secs=$1; shift
bin=${VMTRACE:-$(dirname "$0")/../../target/release/vmtrace}
out=$(mktemp -d)
/usr/bin/time -f "maxrss_kb %M" -o $out/time $bin record -a -o $out/rec "$@" > /dev/null 2> $out/stderr &
tp=$!
sleep 3
vp=$(pgrep -P $tp | head -1)
end=$(( $(date +%s) + secs ))
while [ $(date +%s) -lt $end ]; do /bin/true; sh -c 'ls /' >/dev/null; python3 -c 'import json'; sleep 0.5; done
echo "before the stop: $(awk '/VmHWM|VmRSS|RssAnon|RssFile/{printf "%s %s ", $1, $2}' /proc/$vp/status)"
t0=$(date +%s.%N); kill -INT $vp; wait $tp; t1=$(date +%s.%N)
echo "the end took $(echo "$t1 - $t0" | bc) s; $(grep maxrss $out/time)"
python3 -c "import json; s=json.load(open('$out/rec/summary.json')); print('lost', s['lost_events'], 'rows', len(s['processes']), 'folding', s.get('folding'))"
rm -rf $out
