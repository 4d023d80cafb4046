#!/bin/bash
# The collector beside a compiler (docs/performance.md): `record -a` while
# one release rebuild of the vmtrace crate runs in the checkout DIR (a second
# worktree: its target/ is touched); prints the rebuild's time, the
# collector's CPU over it, its memory at the end, and what was lost.
# usage: [VMTRACE=path/to/vmtrace] docs/scripts/beside-build.sh DIR
dir=$1
bin=${VMTRACE:-$(dirname "$0")/../../target/release/vmtrace}
out=$(mktemp -d)
$bin record -a -o $out/rec >/dev/null 2>$out/err & vp=$!
sleep 3
c0=$(awk '{print $14+$15}' /proc/$vp/stat); t0=$(date +%s.%N)
(cd "$dir" && touch vmtrace/src/lib.rs && cargo build --release -p vmtrace >/dev/null 2>&1)
c1=$(awk '{print $14+$15}' /proc/$vp/stat); t1=$(date +%s.%N)
mem=$(awk '/VmHWM|VmRSS|RssAnon/{printf "%s %s ", $1, $2}' /proc/$vp/status)
kill -INT $vp; wait $vp
lost=$(python3 -c "import json; s=json.load(open('$out/rec/summary.json')); print(s['lost_events'], s.get('stacks',{}).get('cut',{}).get('lighter_stacks',0))")
echo "rebuild $(echo "$t1 - $t0" | bc) s; collector cpu $(echo "scale=1; ($c1 - $c0) / ($t1 - $t0)" | bc)% of a core; $mem; lost, lighter_stacks: $lost"
rm -rf $out
