#!/bin/bash
# `record -a --duration 300` beside the churn loop of docs/agent.md and a
# long-lived Python process that makes new stacks all the time (a new
# function every ~25 ms, called 5 times, each call allocating 200 KB,
# mmap'd under MALLOC_MMAP_THRESHOLD_=65536: faults on every call). Writes
# the collector's RssAnon every 30 s to OUT/rss and its weights log
# (`RUST_LOG=vmtrace::weights=debug`) to OUT/log; the recording in OUT/rec.
# usage: docs/scripts/churn-live-stacks.sh BIN OUT [VAR=value ...]
BIN=$1; OUT=$2; shift 2
rm -rf "$OUT"; mkdir -p "$OUT"
. "$(dirname "$0")/churn-load.sh"
sleep 1
env "$@" RUST_LOG=vmtrace::weights=debug "$BIN" record -a --duration 300 -o "$OUT/rec" 2>"$OUT/log" &
VM=$!
for t in $(seq 30 30 300); do
  sleep 30
  echo "$t $(grep RssAnon /proc/$VM/status 2>/dev/null | awk '{print $2}') kB" >> "$OUT/rss"
done
wait $VM; echo "rc $?" >> "$OUT/rss"
kill $CHURN $LONG
