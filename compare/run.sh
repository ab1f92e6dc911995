#!/usr/bin/env bash
# Measures runqueue (flag off and on), asynq and BullMQ on one Redis, in one
# run, by one method (see README.md), ROUNDS rounds with the systems in
# turn, and prints the table. Every system's round flushes the Redis: give it one of
# its own, e.g. redis-server --port 6400 --save '' --appendonly no.
# Usage: compare/run.sh [host:port] [rounds] [jobs]
set -euo pipefail
cd "$(dirname "$0")"
addr="${1:-127.0.0.1:6379}"
rounds="${2:-3}"
jobs="${3:-20000}"
out="$(mktemp)"
go build -o "$out.bin" .
(cd bullmq && npm ci --no-audit --no-fund --silent)
for round in $(seq "$rounds"); do
  for sys in runqueue-off runqueue-on asynq bullmq; do
    echo "round $round: $sys" >&2
    if [ "$sys" = bullmq ]; then
      node bullmq/bench.mjs -redis "$addr" -jobs "$jobs" >>"$out"
    else
      "$out.bin" -redis "$addr" -system "$sys" -jobs "$jobs" >>"$out"
    fi
  done
done
cat "$out" >&2
"$out.bin" -table "$out"
rm -f "$out" "$out.bin"
