#!/bin/bash
# Side by side: the churn load of docs/scripts/churn-live-stacks.sh, and two or more collectors
# (`record -a --duration D`), a = BIN_A with env ENV_A, b = BIN_B with env ENV_B (c, ... likewise),
# started together; RssAnon, RssFile, VmHWM and CPU ticks (utime+stime) of each every 10 s to OUT/rss.
# usage: docs/scripts/churn-side-by-side.sh OUT D BIN_A "ENV_A" BIN_B "ENV_B" [BIN_C "ENV_C" ...]
# (docs/performance.md, "What the collector's heap holds under churn").
OUT=$1; D=$2; shift 2
rm -rf "$OUT"; mkdir -p "$OUT"
. "$(dirname "$0")/churn-load.sh"
sleep 1
NAMES=(); PIDS=(); i=0
while [ $# -ge 2 ]; do
  n=$(printf "\\x$(printf %x $((97 + i)))")
  env $2 RUST_LOG=vmtrace::weights=debug "$1" record -a --duration $D -o "$OUT/$n" 2>"$OUT/$n.log" >"$OUT/$n.out" &
  PIDS+=($!); NAMES+=($n)
  echo "$n $! $1 $2" >> "$OUT/rss"
  shift 2; i=$((i + 1))
done
T0=$(date +%s)
alive() { for p in "${PIDS[@]}"; do kill -0 $p 2>/dev/null && return 0; done; return 1; }
while alive; do
  line="$(( $(date +%s) - T0 ))"
  for k in "${!PIDS[@]}"; do
    p=${PIDS[$k]}
    line+=" ${NAMES[$k]} $(awk '/RssAnon|RssFile|VmHWM/{printf "%s %s ", $1, $2}' /proc/$p/status 2>/dev/null)"
    line+="cpu $(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null)"
  done
  echo "$line load $(cut -d' ' -f1 /proc/loadavg)" >> "$OUT/rss"
  sleep 10
done
for k in "${!PIDS[@]}"; do wait ${PIDS[$k]}; echo "rc ${NAMES[$k]} $?" >> "$OUT/rss"; done
kill $CHURN $LONG
