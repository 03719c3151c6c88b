#!/usr/bin/env bash
# Screenshot of rq-dashboard on a queue in progress (docs/dashboard.png), with headless Chromium
# from Debian's packages (apt-get install chromium). Everything runs on this machine's CPU with
# the tiny model; two workers named after GPUs 0 and 1 by the lease (no GPU is used).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
WORK=$(mktemp -d)
PORT=$($BIN/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DASH=$($BIN/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export OMP_NUM_THREADS=1 REDIS_URL=redis://127.0.0.1:$PORT/0 DIFFQ_CACHE=$WORK/cache DIFFQ_LEASE_SCOPE=screenshot DIFFQ_DEVICE=cpu
pids=()
trap 'kill -9 "${pids[@]}" 2>/dev/null; wait 2>/dev/null; tail -5 "$WORK"/w*.log; rm -rf "$WORK"' EXIT
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --dir "$WORK" >/dev/null & pids+=($!)
sleep 0.5
$BIN/producer enqueue examples/prompts.csv --model tiny --width 128 --height 128 --steps 40 \
  --chunk-size 2 --output "$WORK/out"
printf 'prompt,adapter\nneeds an adapter nobody has,/models/missing-dora\n' > "$WORK/bad.csv"
$BIN/producer enqueue "$WORK/bad.csv" --model tiny --width 128 --height 128 --steps 4 --output "$WORK/out" --no-path-checks
for i in 0 1; do $BIN/worker run --gpu-lease 0,1 >"$WORK/w$i.log" 2>&1 & pids+=($!); done
RQ_DASHBOARD_PASSWORD=screenshot $BIN/producer dashboard --port "$DASH" >/dev/null 2>&1 & pids+=($!)
# wait until some jobs are done and two are running
for _ in $(seq 240); do [ "$($BIN/producer status --json | $BIN/python -c 'import json,sys; j=json.load(sys.stdin)["jobs"]; print(int(j["finished"]>=2 and j["running"]>=1))')" = 1 ] && break; sleep 1; done
shot() {  # basic auth in the URL; the background-networking flags keep Chromium off the closed network
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1000 --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --user-data-dir="$WORK/chromium" \
    --virtual-time-budget=8000 --screenshot="$1" "http://diffq:screenshot@127.0.0.1:$DASH/0/view/$2" 2>/dev/null
}
shot docs/dashboard.png queues
shot docs/dashboard-workers.png workers
$BIN/producer status
echo "wrote docs/dashboard.png and docs/dashboard-workers.png"
