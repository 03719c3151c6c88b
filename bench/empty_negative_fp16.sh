#!/bin/bash
# The empty-negative lever under fp16 on one GPU (carry .whl and .redis): the worker's other
# default levers without and with it (auto then meant the first), compiled side by side (Redis db 0 and 1), then 64 images each through the
# queue, then their PNGs compared (same names: PSNR, max difference). JSON lines to $OUT/fp16.jsonl.
#   bash bench/empty_negative_fp16.sh
set -u
OUT=${OUT:-/tmp/out}
R=$OUT/fp16.jsonl
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv | tee $OUT/gpu.txt
for t in fp16 fp16en; do sp=vae-fp16,compile-unet,compile-vae; db=0; [ $t = fp16en ] && { sp=vae-fp16,compile-unet,compile-vae,empty-negative; db=1; }
  timeout 330 python3 bench/e2e_queue.py --out $R --tag warm$t --precision fp16 --chunk 8 --images-per-gpu 8 --speedups $sp --redis-url redis://127.0.0.1:6390/$db --timeout 320 > $OUT/warm-$t.log 2>&1 &
done; wait; echo "warm done $SECONDS"
for t in fp16 fp16en; do sp=vae-fp16,compile-unet,compile-vae; [ $t = fp16en ] && sp=vae-fp16,compile-unet,compile-vae,empty-negative
  timeout 150 python3 bench/e2e_queue.py --out $R --tag $t --precision fp16 --chunk 8 --images-per-gpu 64 --speedups $sp --timeout 140 > $OUT/queue-$t.log 2>&1; echo "$t done $SECONDS"
done
python3 bench/quality.py /tmp/diffq-bench/bench1fp16 /tmp/diffq-bench/bench1fp16en --tag fp16-empty-negative-vs-defaults --out $R 2>&1 | tail -2
python3 -c "
import json
for l in open('$R'):
    r=json.loads(l); print({k:r.get(k) for k in ('tag','speedups','steady_img_per_s','median_job_s','median_denoise_s','images','pngs_on_disk','launch_to_first_image_s','psnr_mean_db','psnr_min_db','max_abs_diff','identical_images')})"
