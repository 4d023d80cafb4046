#!/bin/bash
# The sizes test nothing_is_lost_beside_heavy_process_churn by hand, with logs.
# $1: out dir, $2: vmtrace binary
out=$1; bin=${2:-target/release/vmtrace}
rm -rf $out; mkdir -p $out
VMTRACE_RELEASE_ABOVE=0 VMTRACE_STACK_SWEEP_MS=2000 RUST_LOG=info,vmtrace::weights=debug,vmtrace::retire=debug,vmtrace::release=debug \
  $bin -v record -a --out $out/rec > $out/stdout 2> $out/stderr &
vm=$!
until grep -q "] tracing " $out/stderr; do sleep 0.2; done
end=$(( $(date +%s) + 20 )); rounds=0
while [ $(date +%s) -lt $end ]; do
  bash -c 'for j in $(seq 20); do ls / >/dev/null; cat /etc/hostname >/dev/null; done'
  /usr/bin/python3 -c 'import json, ssl, sqlite3, decimal'
  rounds=$((rounds+1))
done
sleep 3
kill -INT $vm; wait $vm
python3 - $out/rec/summary.json $rounds <<'PY'
import json,sys
s=json.load(open(sys.argv[1])); r=int(sys.argv[2])
p=s['processes']; o=[x for x in p if x['pid']==0]
seen=len(p)-1+(o[0].get('folded',0) if o else 0)
st=s['stacks']; held=st.get('drained_stacks',0); live=st.get('drained_stacks_of_live',0)
print('rounds',r,'lost',s.get('lost_events'),'drops',s['drops'])
print('seen',seen,'held',held,'of_live',live,'swept',st.get('swept_stacks'),'PASS' if 4*max(held-live,0)<seen else 'FAIL')
PY
