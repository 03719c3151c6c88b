# Models, samplers and scorers through the queue on one GPU (issues 77 and 79), one call:
#   switch  SDXL 30 steps, CFG 5, batch 8: euler and dpm++2m-karras in turn, two jobs each
#           (the first job after a switch against a steady one: switch_ratio)
#   schnell the FLUX architecture at the flux-schnell recipe's settings (4 steps, guidance 0), batch 4
#   plain / scored  SDXL 30 steps, CFG 5, batch 8, without and with --score clip,pickscore
#           (CLIP-L and CLIP-H architectures with random weights)
#   lightning32  SDXL at the sdxl-lightning-4 recipe's settings (4 steps, no CFG, euler trailing), jobs of 32
# Lines to $OUT/models.jsonl; each phase's worker log beside it.
#   bash bench/models_device.sh switch schnell plain scored
source bench/device_setup.sh || exit 1
export DIFFQ_CACHE=/tmp/diffq-cache BENCH_COMMIT=${BENCH_COMMIT:-unknown}
Q="python3 bench/e2e_queue.py --out $OUT/models.jsonl --logs $OUT --gpu-counts 1"
for phase in "$@"; do
  echo "== $phase $(date +%T)"
  case $phase in
    switch) $Q --tag switch --images-per-gpu 48 --chunk 8 --block 16 --samplers euler,dpm++2m-karras ;;
    schnell) $Q --tag schnell --model flux-random --steps 4 --guidance 0 --chunk 4 --images-per-gpu 48 ;;
    plain) $Q --tag plain --images-per-gpu 32 --chunk 8 ;;
    lightning32) $Q --tag lightning32 --images-per-gpu 96 --chunk 32 --steps 4 --guidance 0 --sampler euler \
      --timestep-spacing trailing ;;
    scored) $Q --tag scored --images-per-gpu 32 --chunk 8 --score clip=clip-l-random,pickscore=clip-h-random ;;
  esac 2>&1 | tail -c 600
done
