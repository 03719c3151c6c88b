#!/bin/bash
# The FP8 issue's measurements on one GPU (source bench/device_setup.sh first; carry .whl and
# .redis). JSON lines to $OUT/fp8.jsonl, logs under $OUT. Phases, in the order given:
#   queue:fp16 queue:fp8   the worker's defaults through the queue, --precision fp16 / fp8
#                          (sdxl-random 1024², 30 steps, CFG 5, chunk 8 or CHUNK; IMAGES_FP16 / IMAGES_FP8;
#                          SPEEDUPS: the worker's levers, auto unless set, e.g. auto,persistent-norms;
#                          SPEEDUPS_FP16 overrides them for fp16)
#   warm                   a cold host's compile caches for both queue phases in one go: an fp16 and an
#                          fp8 worker compile side by side (Redis db 0 and 1), one job each (WARM_S);
#                          each picks its batch against what the other leaves free, so CHUNK 16 at most
#   quality                the fp8 run's PNGs against the fp16 run's (same names: PSNR, SSIM)
#   error                  the UNet's FP8 output error at each of 30 steps (bench/fp8_unet.py; GRANULARITY)
#   time                   one compiled UNet call: fp16, FP8 per-tensor, FP8 per-row (batch 8); VARIANTS
#                          picks them (tensor-linears: FP8 linears, fp16 convolutions), PROFILE=1 adds
#                          each call's kernel time by class and its top kernels
#   adapters:fp8           none, LoRA, DoRA in turn under fp8 (first job of a new adapter)
#   flux                   flux-random (bf16, 1024², 28 steps, compiled blocks) through the queue without
#                          and with --precision fp8 (FLUX_IMAGES each, chunk 4), their images compared,
#                          then the transformer's FP8 output error at each step (2 prompts)
#   bash bench/fp8_device.sh queue:fp16 queue:fp8 quality error
set -u
OUT=${OUT:-/tmp/out}
R=$OUT/fp8.jsonl
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6390/0}
speedups() { [ $1 = fp16 ] && echo ${SPEEDUPS_FP16:-${SPEEDUPS:-auto}} || echo ${SPEEDUPS:-auto}; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee -a $OUT/gpu.txt
for phase in "$@"; do
  echo "== $phase $(date +%T) (${SECONDS}s)" | tee -a $OUT/phases.txt
  case $phase in
    queue:*)
      p=${phase#queue:}
      n=$([ $p = fp8 ] && echo ${IMAGES_FP8:-96} || echo ${IMAGES_FP16:-64})
      timeout ${QUEUE_S:-280} python3 bench/e2e_queue.py --out $R --tag $p --precision $p --images-per-gpu $n \
        --chunk ${CHUNK:-8} --speedups $(speedups $p) --timeout $(( ${QUEUE_S:-280} - 10 )) > $OUT/queue-$p.log 2>&1
      tail -c 1500 $OUT/queue-$p.log ;;
    warm)
      for p in fp16 fp8; do
        db=$([ $p = fp8 ] && echo 1 || echo 0)
        timeout ${WARM_S:-530} python3 bench/e2e_queue.py --out $R --tag warm-$p --precision $p --chunk ${CHUNK:-8} \
          --images-per-gpu ${CHUNK:-8} --speedups $(speedups $p) --redis-url ${REDIS_URL%/*}/$db \
          --timeout $(( ${WARM_S:-530} - 10 )) > $OUT/warm-$p.log 2>&1 &
      done
      wait
      tail -c 400 $OUT/warm-fp16.log $OUT/warm-fp8.log ;;
    quality)
      python3 bench/quality.py /tmp/diffq-bench/bench1fp16 /tmp/diffq-bench/bench1fp8 --tag sdxl-fp8-vs-fp16 --out $R \
        2>&1 | tee $OUT/quality.log ;;
    error)
      timeout ${ERROR_S:-150} python3 bench/fp8_unet.py --out $R --error-prompts 4 --granularity ${GRANULARITY:-tensor} 2>&1 | grep -v Warning | tee $OUT/error.log ;;
    time)
      timeout ${TIME_S:-300} python3 bench/fp8_unet.py --out $R --time ${VARIANTS:-fp16,tensor,row} --batch 8 ${PROFILE:+--profile} 2>&1 \
        | grep -v Warning | tee $OUT/time.log ;;
    flux)
      F="--model flux-random --steps 28 --guidance 3.5 --chunk 4 --speedups vae-fp16,compile-blocks"
      for p in fp16 fp8; do
        timeout ${FLUX_S:-170} python3 bench/e2e_queue.py --out $R --tag flux-$p --precision $p $F \
          --images-per-gpu ${FLUX_IMAGES:-16} --timeout $(( ${FLUX_S:-170} - 10 )) > $OUT/queue-flux-$p.log 2>&1
        tail -c 600 $OUT/queue-flux-$p.log
      done
      python3 bench/quality.py /tmp/diffq-bench/bench1fluxfp16 /tmp/diffq-bench/bench1fluxfp8 --tag flux-fp8-vs-bf16 \
        --out $R 2>&1 | tee $OUT/quality-flux.log
      timeout ${ERROR_S:-150} python3 bench/fp8_unet.py --model flux-random --dtype bfloat16 --steps 28 --out $R \
        --error-prompts 2 2>&1 | grep -v Warning | tee $OUT/error-flux.log ;;
    adapters:*)
      p=${phase#adapters:}
      [ -d /tmp/adapters/dora ] || (CUDA_VISIBLE_DEVICES="" nice python3 bench/make_adapters.py /tmp/adapters > $OUT/adapters.log 2>&1)
      timeout ${QUEUE_S:-280} python3 bench/e2e_queue.py --out $R --tag adapters-$p --precision $p --images-per-gpu 72 \
        --timeout $(( ${QUEUE_S:-280} - 10 )) --adapters none,/tmp/adapters/lora,/tmp/adapters/dora \
        > $OUT/adapters-$p.log 2>&1 ;;
  esac
done
grep -h "fp8\|compiled for\|ready in\|adapter" $OUT/worker-*.log 2>/dev/null | cut -c1-300 > $OUT/worker-lines.txt
rm -f $OUT/worker-*.log
echo "== done ${SECONDS}s" | tee -a $OUT/phases.txt
