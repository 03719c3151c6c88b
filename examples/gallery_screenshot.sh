#!/usr/bin/env bash
# Screenshots of `producer gallery` (docs/gallery.png, docs/gallery-pairs.png) on a preference
# campaign made here on the CPU: two tiny models x four images per prompt, two tiny scorers, one
# burst worker. Headless Chromium from Debian's packages (apt-get install chromium).
# tests/test_preference_campaign.py runs the same campaign and checks its gallery.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
WORK=$(mktemp -d)
free() { $BIN/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PORT=$(free); GALLERY=$(free)
export OMP_NUM_THREADS=1 REDIS_URL=redis://127.0.0.1:$PORT/0 DIFFQ_CACHE=$WORK/cache DIFFQ_DEVICE=cpu
pids=()
trap 'kill -9 "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --dir "$WORK" >/dev/null & pids+=($!)
sleep 0.5
printf 'prompt\na red fox in snow\na lighthouse at dusk\na bowl of ramen\n' > "$WORK/p.csv"
$BIN/producer enqueue "$WORK/p.csv" --model tiny --model tiny-pixart --width 96 --height 96 --steps 4 \
  --num-images 4 --score clip=tiny-clip,aesthetic=tiny-clip --output "$WORK/out"
$BIN/worker run --burst --device cpu > "$WORK/w.log" 2>&1
RQ_DASHBOARD_PASSWORD=screenshot $BIN/producer gallery "$WORK/out" --port "$GALLERY" >/dev/null 2>&1 & pids+=($!)
for _ in $(seq 60); do curl -sf -u diffq:screenshot "http://127.0.0.1:$GALLERY/" >/dev/null && break; sleep 0.5; done
shot() {  # basic auth in the URL; the background-networking flags keep Chromium off the closed network
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1300,900 --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --user-data-dir="$WORK/chromium" \
    --virtual-time-budget=8000 --screenshot="$1" "http://diffq:screenshot@127.0.0.1:$GALLERY$2" 2>/dev/null
}
shot docs/gallery.png "/?by=aesthetic"
shot docs/gallery-pairs.png "/pairs?by=aesthetic&margin=0.05"
echo "wrote docs/gallery.png and docs/gallery-pairs.png"
