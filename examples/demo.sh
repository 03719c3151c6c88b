#!/usr/bin/env bash
# The main path end to end on this machine: a throwaway Redis on a free port, the example
# prompts enqueued for the `tiny` model, one worker draining the queue, then a summary.
# Leaves no process behind (the trap stops Redis and any worker, whatever happens).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
OUT=${OUT:-$PWD/out/demo}
started=$(date +%s)

workdir=$(mktemp -d)
port=$("$BIN/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --dir "$workdir" --save "" --appendonly no \
  --daemonize yes --pidfile "$workdir/redis.pid" --logfile "$workdir/redis.log"
cleanup() {  # the worker first, while Redis still answers it; then Redis
  if [ -n "${worker_pid:-}" ]; then
    kill "$worker_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$worker_pid" 2>/dev/null || break; sleep 0.3; done
    kill -9 "$worker_pid" 2>/dev/null || true
  fi
  [ -f "$workdir/redis.pid" ] && kill "$(cat "$workdir/redis.pid")" 2>/dev/null || true
  sleep 0.2; rm -rf "$workdir"
}
trap cleanup EXIT
export REDIS_URL="redis://127.0.0.1:$port/0" DIFFQ_QUEUE=demo
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
echo "== Redis on port $port (throwaway)"

rm -rf "$OUT"
echo "== producer enqueue examples/prompts.csv"
"$BIN/producer" enqueue examples/prompts.csv --model tiny --width 128 --height 128 --steps 8 --output "$OUT"

echo "== worker run --burst (tiny model on the CPU; the first run writes it to the cache); its log: $OUT.worker.log"
mkdir -p "$(dirname "$OUT")"
"$BIN/worker" run --burst --device cpu >"$OUT.worker.log" 2>&1 &
worker_pid=$!
# a busy machine is slow, not stuck: give up only when nothing has moved for 2 minutes
"$BIN/producer" wait --stall-timeout 120
wait "$worker_pid" || { tail -20 "$OUT.worker.log"; exit 1; }; worker_pid=

echo "== producer status"
"$BIN/producer" status
images=$(find "$OUT/images" -name '*.png' | wc -l)
echo "== $images images in $OUT/images, one line each in $OUT/metadata.jsonl ($(($(date +%s) - started))s)"
