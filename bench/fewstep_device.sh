# Few-step campaigns and FP8 through the queue on one GPU (issue 81), one call:
#   light:<precision>:<format>[:<decoder>]  SDXL at the sdxl-lightning-4 recipe's settings (4 steps,
#                               no CFG, euler trailing), jobs of CHUNK (16), 96 images; format png, jpeg,
#                               webp; decoder taesdxl-random (TAESD-XL's architecture) or none: the VAE; LIGHT_SPEEDUPS (auto) its levers
#   neg:<precision>             SDXL 30 steps, CFG 5, MLPerf's negative prompt on every row; fp16 in jobs
#                               of 8 (64 images), fp8 in jobs of 16 (96 images)
#   schnell:<precision>         the FLUX architecture at the flux-schnell recipe's settings (4 steps,
#                               guidance 0), jobs of SCHNELL_CHUNK (4), 48 images; bf16 or fp8
#   route:<max_models>          a campaign of two models in blocks of 8 rows, in turn (sdxl-random and
#                               flux-random, 4 steps, guidance 0, ROUTE_SPEEDUPS (none): loads, not speed)
#   newhost:<phase>             <phase> again as a new host of the fleet: an empty cache folder, the
#                               same Redis (every phase runs with DIFFQ_COMPILE_CACHE=redis): its first
#                               image is the cold start of a GPU model the fleet has seen; put it
#                               right after the phase whose fleet it joins (any other phase empties
#                               the Redis first)
# Lines to $OUT/fewstep.jsonl (with the phase's median encode/denoise/decode/save, the job's host
# time outside the pipeline and RQ's time between jobs); each phase's worker log beside it.
#   BENCH_COMMIT=$(git rev-parse --short HEAD) bash bench/fewstep_device.sh light:fp16:png light:fp16:jpeg
source bench/device_setup.sh || exit 1
export DIFFQ_CACHE=${DIFFQ_CACHE:-/tmp/diffq-cache} BENCH_COMMIT=${BENCH_COMMIT:-unknown} DIFFQ_COMPILE_CACHE=redis
# SEED_PROFILES: memory profiles an earlier call measured on this GPU model (as a fleet keeps them)
[ -n "$SEED_PROFILES" ] && mkdir -p "$DIFFQ_CACHE" && cp "$SEED_PROFILES" "$DIFFQ_CACHE/memory-profiles.json"
Q="python3 bench/e2e_queue.py --out $OUT/fewstep.jsonl --logs $OUT --gpu-counts 1 --timeout ${PHASE_S:-260}"
LIGHT="--steps 4 --guidance 0 --sampler euler --timestep-spacing trailing"
Q0=$Q
for phase in "$@"; do
  echo "== $phase $(date +%T) (${SECONDS}s)"
  tagged="" Q=$Q0
  if [[ $phase == newhost:* ]]; then
    phase=${phase#newhost:}; tagged="newhost-"; export DIFFQ_CACHE=/tmp/diffq-cache-newhost-$SECONDS
    Q="$Q --keep-fleet"  # the Redis of the phases before: the fleet's compiled graphs and profiles
  fi
  IFS=: read -r what precision format decoder <<< "$phase"
  case $what in
    light) $Q --tag "${tagged}light-$precision-$format${decoder:+-$decoder}" $LIGHT --precision $precision \
      --image-format ${format:-png} ${decoder:+--decoder $decoder} --speedups ${LIGHT_SPEEDUPS:-auto} --chunk ${CHUNK:-16} --images-per-gpu ${LIGHT_IMAGES:-96} ;;
    neg) chunk=$([ $precision = fp8 ] && echo 16 || echo 8); n=$([ $precision = fp8 ] && echo 96 || echo 64)
      $Q --tag "${tagged}neg-$precision" --negative-prompt mlperf --precision $precision --chunk $chunk --images-per-gpu $n ;;
    route) $Q --tag "route-$precision" --models sdxl-random,flux-random --model sdxl-random --steps 4 --guidance 0 \
      --chunk 8 --images-per-gpu ${ROUTE_IMAGES:-64} --max-models ${precision:-1} --speedups ${ROUTE_SPEEDUPS:-none} --timeout ${ROUTE_S:-170} ;;
    schnell) $Q --tag "${tagged}schnell-$precision" --model flux-random --steps 4 --guidance 0 --chunk ${SCHNELL_CHUNK:-4} \
      --images-per-gpu 48 $([ $precision = fp8 ] && echo "--precision fp8") ;;
  esac 2>&1 | tail -c 700
done
cp "$DIFFQ_CACHE/memory-profiles.json" "$OUT/memory-profiles.json" 2>/dev/null || true
# a call brings back at most 8 files: the workers' logs go back as one
logs=$(cd "$OUT" && ls worker-*.log 2>/dev/null)
[ -n "$logs" ] && tar czf /tmp/fewstep-logs.tgz -C "$OUT" $logs && (cd "$OUT" && rm -f $logs) && mv /tmp/fewstep-logs.tgz "$OUT/"
