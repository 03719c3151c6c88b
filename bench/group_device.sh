# xDiT group benchmarks on a lent multi-GPU machine; source bench/device_setup.sh first.
#   bash bench/group_device.sh sdxl   # SDXL: 1 GPU vs our 2-GPU CFG parallel, batch 1 and 4
#   bash bench/group_device.sh flux   # FLUX.1 architecture: 1 and 2 GPUs (Ulysses)
#   bash bench/group_device.sh flux4  # FLUX: 4 GPUs (Ulysses, Ulysses×ring, Ulysses×PipeFusion), then through the queue
#   bash bench/group_device.sh flux8  # FLUX: 4 and 8 GPUs, then the group through the queue
#   bash bench/group_device.sh profile2  # FLUX: 1 GPU, Ulysses 2, ring 2 under torch.profiler; the 2-GPU group through the queue
#   bash bench/group_device.sh groups2   # a data-parallel group next to 2 workers (FLUX); SDXL CFG parallel compiled
#   bash bench/group_device.sh compile2  # FLUX: 1 GPU and Ulysses 2, eager and compile-blocks; the group through the queue
#   bash bench/group_device.sh flux4c  # FLUX: 1 GPU, Ulysses 4 and 2, all compiled; Ulysses 4 through the queue
#   bash bench/group_device.sh sdxl4  # SDXL batch 4: 1 GPU vs CFG parallel (split decode), the worker's levers
#   bash bench/group_device.sh flux2048  # FLUX 2048²: 1 GPU, Ulysses 2, Ulysses 2 + parallel VAE; 1024² Ulysses 2 under CUDA graphs
#   bash bench/group_device.sh handoff   # a single worker too small for SDXL hands its jobs to a one-rank group
#   bash bench/group_device.sh graphsteps  # FLUX 1024²: 1 GPU and Ulysses 2, compiled, each without and with one CUDA graph per step; SDXL batch 1 too
#   bash bench/group_device.sh graphs2  # SDXL batch 1: 1 GPU without and with cuda-graphs, the CFG pair's defaults, bare and queued
#   bash bench/group_device.sh graphs4  # the same at batch 4 (after graphs2, same machine)
#   bash bench/group_device.sh rowtune  # SDXL's UNet at 1 row (GPU 0) and 2 rows (GPU 1): CUDA graphs, then with GEMM autotuning
#   bash bench/group_device.sh blocktune  # the same on one 32x32-level transformer of SDXL's UNet (small enough to tune in a call)
#   bash bench/group_device.sh cfgprofile  # SDXL batch 1: 1 GPU (worker levers) vs CFG parallel, under torch.profiler
#   bash bench/group_device.sh fluxprofile  # FLUX 1024², compiled blocks: 1 GPU and Ulysses 2 (xDiT) under torch.profiler; diffusers' own Ulysses, ours in parts; comm overlap
#   bash bench/group_device.sh fluxcp  # FLUX 1024² Ulysses 2: xDiT's split against diffusers' (profiled; NCCL P2P channels, comm reordering, step graphs)
#   bash bench/group_device.sh fluxoverlap  # FLUX 1024²: 1 GPU, the product's Ulysses 2, with its single-stream exchanges overlapped, each with step graphs (and whether those processes exit)
#   bash bench/group_device.sh fluxringq  # FLUX 1024² on 2 GPUs: the product's ring (diffusers', cuDNN, gather overlapped) against 1 GPU and Ulysses 2, through the queue, a rank killed
#   bash bench/group_device.sh fluxring3  # FLUX 1024² ring of 2 and 1 GPU under the profiler; NCCL's CTA policy and channels beside the local attention
#   bash bench/group_device.sh fluxring4  # FLUX 1024² ring of 2: the ring's own attention against diffusers' ring and 1 GPU, profiled, queued
#   bash bench/group_device.sh fluxring5  # FLUX 2048² ring of 2 with its own attention against 1 GPU; a rank killed mid-job
#   bash bench/group_device.sh flux4own  # FLUX 1024² on 4 GPUs: the product's ring of 4 (its own attention) against diffusers' ring and 1 GPU
#   bash bench/group_device.sh fluxring6  # FLUX 1024² ring of 2 profiled with its gather overlapped and not: NCCL's cost to the compute beside it
#   bash bench/group_device.sh copygather  # NCCL's all-gather against the copy engines' pull, alone and beside GEMMs of a FLUX block's shape
#   bash bench/group_device.sh fluxring7  # FLUX 1024² ring of 2: the peers pulled by the copy engines (experiment) against NCCL's gather and 1 GPU
#   bash bench/group_device.sh fluxwhere  # FLUX 1024²: 1 GPU and the ring of 2 profiled, each kind's heaviest kernels by name
#   bash bench/group_device.sh fluxring8  # FLUX 1024² ring of 2: cuDNN handed views of tokens-first memory (experiment) against the product's copies, and 1 GPU
#   bash bench/group_device.sh fluxdecode  # FLUX ring of 2: the decoder split by rows over the ranks against each decoding all of it, 1024² and 2048²
#   bash bench/group_device.sh fluxmod  # FLUX 1024²: modulation-once on 1 GPU and in the ring of 2, each against the same levers without it; the ring as one attention (experiment)
#   bash bench/group_device.sh fluxmerge  # FLUX 1024² ring of 2: the last merge as one kernel (the product's) against the merge fused by Inductor, and 1 GPU
#   bash bench/group_device.sh exitq  # the FLUX ring of 2 and the SDXL CFG pair through the queue: each group's exit code and exit time
#   bash bench/group_device.sh pairparts  # one GPU: an SDXL CFG pair's serial parts at batch 1 (decode whole and at half rows, the split twin compiled; the prompt's encode eager and compiled)
#   bash bench/group_device.sh decodemem  # one GPU: FLUX's decoder (bf16) whole against a rank's split twin, peak memory and time, its GroupNorm in parts and whole; then compiled
#   bash bench/group_device.sh fluxvae  # one GPU: FLUX 1024² without and with compile-vae, alternated; 2048² each once (time, peak memory)
#   bash bench/group_device.sh fluxvaeq  # one GPU: a FLUX single worker through the queue, the DiT's levers without compile-vae and auto (with it)
#   bash bench/group_device.sh fluxphases  # one GPU: FLUX 1024² and 2048² with the DiT's defaults, each call's encode / denoise / decode
#   bash bench/group_device.sh encgraphs  # one GPU: the prompt's encode eager and with encoder-graphs (SDXL, FLUX); one SDXL image at batch 1 and one FLUX image without and with it
#   bash bench/group_device.sh encgraphsq  # one GPU: an SDXL single worker through the queue with cuda-graphs, without and with encoder-graphs; FLUX bare again
#   bash bench/group_device.sh fusedrows  # one GPU: SDXL's UNet (a 32x32 transformer at 1 and 2 rows, the whole at 1) under CUDA graphs without and with fuse-qkv
#   bash bench/group_device.sh ringcalls  # one GPU: a ring rank's attention calls (two and a merge) against one call over all keys, heads-first and through views
#   bash bench/group_device.sh queue1  # one GPU: a one-image SDXL job through the queue against its bare call, rank 0's main thread timed by part
#   bash bench/group_device.sh pinned1  # one GPU: the pipeline's device pinned against looked up on every ask, alternated (SDXL b1, FLUX 1024²), and SDXL through the queue
#   bash bench/group_device.sh rounding2  # 2 GPUs: FLUX 1024² and 2048², one GPU and the ring of 2, pixels rounded on the device against on the host, alternated
#   bash bench/group_device.sh done2q  # 2 GPUs, one call: the SDXL CFG pair at batch 1 against one GPU with its levers, and through the queue
#   bash bench/group_device.sh done2  # then done2b, done2c, done2d: 2 GPUs, back to back on one machine: the issue's "done means" (SDXL b1; FLUX 1024²/2048²; SDXL b4; data parallel)
#   bash bench/group_device.sh cfgsplit  # 2 GPUs: the SDXL CFG pair at batch 1, its image decoded split by rows against whole, alternated, against 1 GPU; queued
#   bash bench/group_device.sh fluxfusering  # 2 GPUs: the FLUX ring of 2 without and with fuse-qkv, alternated, against one GPU
#   bash bench/group_device.sh fusering2  # 2 GPUs: one GPU without and with fuse-qkv, the ring with it on a cold cache and warm (twice), without it between
#   bash bench/group_device.sh fusestarts  # 2 GPUs: the ring with fuse-qkv launched 8 times (does a rank die at load?)
#   bash bench/group_device.sh fuse2048  # 2 GPUs: FLUX 2048², one GPU against the ring of 2 with its defaults (fuse-qkv among them), time and peak memory
#   bash bench/group_device.sh fluxmodq  # FLUX 1024²: 1 GPU and the ring of 2 with modulation-once profiled by kernel name; the ring through the queue
#   bash bench/group_device.sh fluxworker  # FLUX 1024²: a single worker through the queue, auto as it was (SDXL's levers) and now (a DiT's)
#   bash bench/group_device.sh fluxgraphs  # FLUX 1024²: 1 GPU, the product's Ulysses 2 without and with its CUDA graphs (the group's default), through the queue, a rank killed mid-job
#   bash bench/group_device.sh flux4g  # FLUX 1024² on 4 GPUs: 1 GPU, Ulysses 4 and 2 as the product runs them (with and without its CUDA graphs), Ulysses 4 through the queue
#   bash bench/group_device.sh flux2048g  # FLUX 2048²: 1 GPU against Ulysses 2 as the product splits it now (diffusers, CUDA graphs), time and peak memory
#   bash bench/group_device.sh flux2048r  # FLUX 2048² on 2 GPUs: the product's ring against its Ulysses and one GPU
#   bash bench/group_device.sh flux4r  # FLUX 1024² on 4 GPUs: the product's ring of 4 against its Ulysses 4 and one GPU
#   bash bench/group_device.sh fluxsplit  # FLUX 1024²: 1 GPU, Ulysses 2 as the product splits it (diffusers) and with xDiT, through the queue, step graphs
# Every measurement appends a JSON line to $OUT/group.jsonl; logs go to $OUT/*.log.
set -u
R=$OUT/group.jsonl
TR="python3 -m torch.distributed.run --standalone"
F="--model flux-random --steps 28 --guidance 3.5"
S="--model sdxl-random --steps 30 --guidance 5.0"

# FLUX 1024²: one compiled GPU, then a ring of 2 with flags A and B alternated (A, B, A again, B again, each while the
# call has time), each image compared with the GPU's; A's first run also under the profiler when $5 is "profile"
#   ring_ab LABEL_A "FLAGS_A" LABEL_B "FLAGS_B" [profile]
# The GPU's levers are the ring's own that apply to one GPU (modulation-once since the fluxmod call, compile-vae since
# the fluxvae call, encoder-graphs since the encgraphs call; the calls before them ran without)
ring_ab() {
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks,compile-vae,modulation-once,encoder-graphs timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 \
    --save /tmp/flux1.npy --out $R --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  local prof="" label flags
  [ "${5:-}" = profile ] && prof="--profile /tmp/prof-r2"
  for v in "$1|$2|$prof" "$3|$4|" "$1-again|$2|" "$3-again|$4|"; do
    IFS='|' read -r label flags prof <<< "$v"
    [ $SECONDS -lt 430 ] && { timeout 130 $TR --nproc-per-node 2 bench/group.py $F --runs 3 --ring-degree 2 $flags \
      --compare /tmp/flux1.npy --out $R --label $label $prof > $OUT/$label.log 2>&1; echo "$label rc=$? at ${SECONDS}s"; }
  done
}
# A single worker through the queue (8 one-image jobs) once per "TAG:LEVERS" argument, in order
#   queue_workers KIND "MODEL FLAGS" TAG:LEVERS...     (the record's tag: KIND-worker-TAG)
queue_workers() {
  local kind=$1 flags=$2 v
  shift 2
  for v in "$@"; do
    timeout 260 python3 bench/e2e_queue.py --out $R $flags --chunk 1 --images-per-gpu 8 --speedups ${v#*:} \
      --tag $kind-worker-${v%%:*} --timeout 240 --logs $OUT > $OUT/worker-${v%%:*}.log 2>&1
    echo "${v%%:*} rc=$? at ${SECONDS}s"
  done
}
flux_workers() { queue_workers flux "$F" "$@"; }
case "$1" in
sdxl)
  timeout 110 $TR --nproc-per-node 1 bench/group.py $S --batches 1,4 --save /tmp/sdxl1.npy --out $R --label sdxl-1gpu > $OUT/sdxl1.log 2>&1
  timeout 110 $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 1,4 --compare /tmp/sdxl1.npy --out $R --label sdxl-cfg2 > $OUT/sdxl2.log 2>&1
  ;;
flux)
  timeout 170 $TR --nproc-per-node 1 bench/group.py $F --runs 1 --save /tmp/flux1.npy --out $R --label flux-1gpu > $OUT/flux1.log 2>&1
  timeout 150 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --compare /tmp/flux1.npy --out $R --label flux-u2 > $OUT/flux2.log 2>&1
  ;;
flux4)
  timeout 170 $TR --nproc-per-node 1 bench/group.py $F --runs 1 --save /tmp/flux1.npy --out $R --label flux-1gpu > $OUT/flux1.log 2>&1
  timeout 120 $TR --nproc-per-node 4 bench/group.py $F --ulysses-degree 4 --compare /tmp/flux1.npy --out $R --label flux-u4 > $OUT/flux4.log 2>&1
  timeout 120 $TR --nproc-per-node 4 bench/group.py $F --ulysses-degree 2 --ring-degree 2 --compare /tmp/flux1.npy --out $R --label flux-u2r2 > $OUT/flux4r.log 2>&1
  timeout 120 $TR --nproc-per-node 4 bench/group.py $F --ulysses-degree 2 --pipefusion-degree 2 --compare /tmp/flux1.npy --out $R --label flux-u2p2 > $OUT/flux4p.log 2>&1
  timeout 150 python3 bench/group_queue.py --gpus 4 $F --degrees "--ulysses-degree 4" --jobs 6 --out $R > $OUT/queue4.log 2>&1
  ;;
overhead)
  timeout 120 $TR --nproc-per-node 4 bench/group.py $F --ulysses-degree 4 --out $R --label flux-u4 > $OUT/flux4.log 2>&1
  for v in nothreads noprogress gcfreeze nothreads,noprogress,gcfreeze; do
    timeout 100 python3 bench/group_queue.py --gpus 4 $F --degrees "--ulysses-degree 4" --jobs 6 --variant $v --out $R > $OUT/queue-$v.log 2>&1
  done
  ;;
queue4)
  timeout 120 $TR --nproc-per-node 4 bench/group.py $F --ulysses-degree 4 --out $R --label flux-u4 > $OUT/flux4.log 2>&1
  timeout 120 python3 bench/group_queue.py --gpus 4 $F --degrees "--ulysses-degree 4" --jobs 8 --out $R > $OUT/queue4.log 2>&1
  ;;
sdxlqueue)
  timeout 120 python3 bench/group_queue.py --gpus 2 $S --degrees=--cfg-parallel --jobs 6 --out $R > $OUT/queue-sdxl2.log 2>&1
  timeout 120 python3 bench/group_queue.py --gpus 2 $S --degrees=--cfg-parallel --jobs 4 --chunk 4 --out $R > $OUT/queue-sdxl2-b4.log 2>&1
  ;;
flux8)
  timeout 120 $TR --nproc-per-node 4 bench/group.py $F --ulysses-degree 4 --compare /tmp/flux1.npy --out $R --label flux-u4 > $OUT/flux4.log 2>&1
  timeout 120 $TR --nproc-per-node 8 bench/group.py $F --ulysses-degree 8 --compare /tmp/flux1.npy --out $R --label flux-u8 > $OUT/flux8.log 2>&1
  timeout 150 python3 bench/group_queue.py --gpus 8 $F --degrees "--ulysses-degree 8" --jobs 5 --out $R > $OUT/queue8.log 2>&1
  ;;
profile2)  # issue 16 goal 1: where one FLUX image's time goes on 2 GPUs, with 1 GPU in the same call
  nvidia-smi topo -m > $OUT/topo.txt
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv >> $OUT/topo.txt
  timeout 170 $TR --nproc-per-node 1 bench/group.py $F --runs 1 --save /tmp/flux1.npy --out $R --label flux-1gpu \
    --profile $OUT/prof-1gpu > $OUT/flux1.log 2>&1
  timeout 150 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 1 --compare /tmp/flux1.npy --out $R \
    --label flux-u2 --profile $OUT/prof-u2 > $OUT/flux2.log 2>&1
  timeout 150 $TR --nproc-per-node 2 bench/group.py $F --ring-degree 2 --runs 1 --compare /tmp/flux1.npy --out $R \
    --label flux-r2 --profile $OUT/prof-r2 > $OUT/flux2r.log 2>&1
  timeout 130 python3 bench/group_queue.py --gpus 2 $F --degrees "--ulysses-degree 2" --jobs 4 --out $R > $OUT/queue2.log 2>&1
  ;;
compile2)  # issue 16 goals 2 and 4: compile-blocks under xDiT against 1 GPU (eager and compiled), then the
  # 2-GPU group through the queue with the writer overlapping PNGs, eager and compiled; one compile cache
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  C=vae-fp16,compile-blocks
  nvidia-smi topo -m > $OUT/topo.txt
  timeout 100 $TR --nproc-per-node 1 bench/group.py $F --runs 1 --save /tmp/flux1.npy --out $R --label flux-1gpu > $OUT/flux1.log 2>&1
  DIFFQ_SPEEDUPS=$C timeout 200 $TR --nproc-per-node 1 bench/group.py $F --runs 2 --compare /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1
  timeout 100 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 1 --compare /tmp/flux1.npy --out $R \
    --label flux-u2 > $OUT/flux2.log 2>&1
  DIFFQ_SPEEDUPS=$C timeout 200 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 2 --compare /tmp/flux1.npy \
    --out $R --label flux-u2-compiled > $OUT/flux2c.log 2>&1
  [ $SECONDS -lt 420 ] && timeout 90 python3 bench/group_queue.py --gpus 2 $F --degrees "--ulysses-degree 2" --jobs 8 --out $R \
    > $OUT/queue2.log 2>&1
  [ $SECONDS -lt 470 ] && DIFFQ_SPEEDUPS=$C timeout 100 python3 bench/group_queue.py --gpus 2 $F --degrees "--ulysses-degree 2" \
    --jobs 8 --out $R > $OUT/queue2c.log 2>&1
  tar czf $OUT/logs.tgz -C $OUT --exclude logs.tgz --exclude group.jsonl . 2>/dev/null
  ;;
groups2)  # issue 16 goal 3 (a data-parallel group next to two single-GPU workers, FLUX, eager) and
  # goal 5 (SDXL CFG parallel with compile-blocks, batch 1 and 4, against 1 GPU with the same levers)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  timeout 100 python3 bench/group_queue.py --gpus 2 $F --degrees "--data-parallel-degree 2" --chunk 2 --jobs 6 --out $R \
    > $OUT/queue-dp2.log 2>&1
  timeout 100 python3 bench/e2e_queue.py --gpu-counts 2 --model flux-random --steps 28 --guidance 3.5 --chunk 1 \
    --images-per-gpu 6 --tag flux --timeout 95 --out $R > $OUT/singles2.log 2>&1
  SC=vae-fp16,compile-blocks
  timeout 90 $TR --nproc-per-node 1 bench/group.py $S --batches 1,4 --save /tmp/sdxl1.npy --out $R --label sdxl-1gpu > $OUT/sdxl1.log 2>&1
  timeout 90 $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 1,4 --compare /tmp/sdxl1.npy --out $R \
    --label sdxl-cfg2 > $OUT/sdxl2.log 2>&1
  [ $SECONDS -lt 360 ] && DIFFQ_SPEEDUPS=$SC timeout 150 $TR --nproc-per-node 1 bench/group.py $S --batches 1,4 \
    --compare /tmp/sdxl1.npy --out $R --label sdxl-1gpu-compiled > $OUT/sdxl1c.log 2>&1
  [ $SECONDS -lt 430 ] && DIFFQ_SPEEDUPS=$SC timeout 130 $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 1,4 \
    --compare /tmp/sdxl1.npy --out $R --label sdxl-cfg2-compiled > $OUT/sdxl2c.log 2>&1
  tar czf $OUT/logs.tgz -C $OUT --exclude logs.tgz --exclude group.jsonl . 2>/dev/null
  ;;
cfgprofile)  # issue 46: where one SDXL image's time goes under CFG parallel on 2 GPUs, against 1 GPU with
  # the single worker's levers (compile-unet, compile-vae); the group's default and the worker's levers on 2
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  W=vae-fp16,compile-unet,compile-vae
  nvidia-smi topo -m > $OUT/topo.txt 2>&1
  DIFFQ_SPEEDUPS=$W timeout 170 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 2 --save /tmp/sdxl1.npy \
    --out $R --label sdxl-1gpu-worker-levers --profile $OUT/prof1 > $OUT/sdxl1.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  timeout 120 $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 1 --runs 2 --compare /tmp/sdxl1.npy \
    --out $R --label sdxl-cfg2-group-default --profile $OUT/prof2 > $OUT/sdxl2.log 2>&1; echo "CFG 2 rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 330 ] && { DIFFQ_SPEEDUPS=$W timeout $((500 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $S \
    --cfg-parallel --batches 1 --runs 2 --compare /tmp/sdxl1.npy --out $R --label sdxl-cfg2-worker-levers \
    --profile $OUT/prof2u > $OUT/sdxl2u.log 2>&1; echo "CFG 2, worker levers rc=$? at ${SECONDS}s"; }
  find $OUT -name '*.trace.json.gz' -delete  # at most 8 files come back: the summaries and logs, in one archive
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -rf $OUT/prof* $OUT/*.log $OUT/topo.txt
  mv /tmp/logs.tgz $OUT/
  ;;
cudagraphs)  # issue 46: the same, the UNet and decoder under CUDA graphs (bench-only --cudagraphs)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor DIFFQ_SPEEDUPS=vae-fp16,compile-unet,compile-vae
  timeout 170 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 3 --save /tmp/sdxl1.npy --out $R \
    --label sdxl-1gpu-worker-levers > $OUT/sdxl1.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  timeout 200 $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 1 --runs 3 --compare /tmp/sdxl1.npy \
    --cudagraphs --out $R --label sdxl-cfg2-cudagraphs > $OUT/sdxl2g.log 2>&1; echo "CFG 2, CUDA graphs rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 380 ] && { timeout $((500 - SECONDS)) $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 3 \
    --cudagraphs --compare /tmp/sdxl1.npy --out $R --label sdxl-1gpu-cudagraphs > $OUT/sdxl1g.log 2>&1; \
    echo "1 GPU, CUDA graphs rc=$? at ${SECONDS}s"; }
  tail -3 $OUT/*.log; tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
graphsteps)  # issue 46: the 2-GPU FLUX call is host-bound; one hand-captured CUDA graph per transformer call
  # (bench/step_graph.py), on 1 GPU and under Ulysses 2, against the same compiled levers without it; one cache
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor DIFFQ_SPEEDUPS=vae-fp16,compile-blocks
  nvidia-smi topo -m > $OUT/topo.txt 2>&1
  timeout 120 $TR --nproc-per-node 1 bench/group.py $F --runs 2 --save /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  timeout 120 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 2 --compare /tmp/flux1.npy --out $R \
    --label flux-u2-compiled > $OUT/flux2c.log 2>&1; echo "Ulysses 2 rc=$? at ${SECONDS}s"
  timeout 120 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 2 --graph-steps --compare /tmp/flux1.npy \
    --out $R --label flux-u2-graphsteps > $OUT/flux2g.log 2>&1; echo "Ulysses 2, step graphs rc=$? at ${SECONDS}s"
  timeout 120 $TR --nproc-per-node 1 bench/group.py $F --runs 2 --graph-steps --compare /tmp/flux1.npy --out $R \
    --label flux-1gpu-graphsteps > $OUT/flux1g.log 2>&1; echo "1 GPU, step graphs rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 400 ] && { timeout $((520 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 2 \
    --graph-steps --parallel-vae --compare /tmp/flux1.npy --out $R --label flux-u2-graphsteps-pvae > $OUT/flux2gp.log 2>&1; \
    echo "Ulysses 2, step graphs, parallel VAE rc=$? at ${SECONDS}s"; }
  tail -4 $OUT/*.log; tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxprofile)  # issue 46: FLUX 1024² on 2 GPUs is 1.45x with compiled blocks; where the other 0.75 s goes (each
  # rank's kernels by kind, the all-to-alls compute does not hide, the text encoders and VAE), whether xDiT's
  # all-to-alls sit inside the compiled blocks' graphs (graph breaks logged); then diffusers' own Ulysses split,
  # whose blocks compile as one graph each (bench/context_parallel.py), with our exchange in 4 parts overlapped
  # with attention, with diffusers' exchange, and with Inductor's comm reordering; one compile cache
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor DIFFQ_SPEEDUPS=vae-fp16,compile-blocks
  nvidia-smi topo -m > $OUT/topo.txt 2>&1
  timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 2 --save /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled --profile $OUT/prof1 > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  TORCH_LOGS=graph_breaks timeout 150 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 2 --xdit \
    --compare /tmp/flux1.npy --out $R --label flux-u2-compiled --profile $OUT/prof2 > $OUT/flux2c.log 2>&1
  echo "Ulysses 2 rc=$? at ${SECONDS}s; graph breaks logged: $(grep -c -i 'graph break' $OUT/flux2c.log)"
  grep -h -i -B2 -A6 'graph break' $OUT/flux2c.log | head -60 > $OUT/graph-breaks.txt
  for v in "diffusers-cp-chunks4:--cp-chunks 4" "diffusers-cp:" \
           "diffusers-cp-chunks4-overlap:--cp-chunks 4 --comm-overlap" "comm-overlap:--xdit --comm-overlap"; do
    [ $SECONDS -lt 450 ] || break
    timeout $((540 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 2 ${v#*:} \
      --compare /tmp/flux1.npy --out $R --label flux-u2-${v%%:*} > $OUT/flux2-${v%%:*}.log 2>&1
    echo "Ulysses 2, ${v%%:*} rc=$? at ${SECONDS}s"
  done
  find $OUT -name '*.trace.json.gz' -delete
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -rf $OUT/prof* $OUT/*.log $OUT/topo.txt
  mv /tmp/logs.tgz $OUT/
  ;;
fluxcp)  # issue 46: diffusers' own Ulysses split (2.624 s) beat xDiT's (2.835 s) in the fluxprofile call; again
  # with 3 runs each, under the profiler, and with the levers left: NCCL's P2P channels (the profile's
  # all-to-alls ran at about 81 GB/s; bench/a2a.py times one exchange per setting), Inductor's comm reordering,
  # one CUDA graph per transformer call (last: a process that captured collectives does not exit by itself)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor DIFFQ_SPEEDUPS=vae-fp16,compile-blocks
  for e in "default:" "p2p32:NCCL_MIN_P2P_NCHANNELS=32" "p2p32-simple:NCCL_MIN_P2P_NCHANNELS=32 NCCL_PROTO=Simple"; do
    env ${e#*:} timeout 60 $TR --nproc-per-node 2 bench/a2a.py --label ${e%%:*} --out $R >> $OUT/a2a.log 2>&1
    echo "a2a ${e%%:*} rc=$? at ${SECONDS}s"
  done
  timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 --save /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  for v in "xdit::--xdit" "diffusers-cp::--profile $OUT/profcp" "diffusers-cp-p2p32:NCCL_MIN_P2P_NCHANNELS=32:" \
           "diffusers-cp-overlap::--comm-overlap" "diffusers-cp-graphsteps::--graph-steps"; do
    [ $SECONDS -lt 470 ] || break
    l=${v%%:*}; rest=${v#*:}; e=${rest%%:*}
    env $e timeout $((550 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 3 ${rest#*:} \
      --compare /tmp/flux1.npy --out $R --label flux-u2-$l > $OUT/flux2-$l.log 2>&1
    echo "Ulysses 2, $l rc=$? at ${SECONDS}s"
  done
  find $OUT -name '*.trace.json.gz' -delete
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -rf $OUT/prof* $OUT/*.log
  mv /tmp/logs.tgz $OUT/
  ;;
fluxoverlap)  # issue 46: the single-stream blocks' all-to-alls (2/3 of the split's 0.30 s per image) overlapped with
  # their MLP (bench/context_parallel.py overlap_exchanges); then both with one CUDA graph per transformer call, whose
  # processes now drop their graphs before the process group (do they exit by themselves?)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor DIFFQ_SPEEDUPS=vae-fp16,compile-blocks
  timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 --save /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  for v in "flux-u2-product:" "flux-u2-overlap:--overlap" "flux-u2-overlap-graphsteps:--overlap --graph-steps" \
           "flux-u2-product-graphsteps:--graph-steps"; do
    [ $SECONDS -lt 450 ] || break
    timeout $((530 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 3 ${v#*:} \
      --compare /tmp/flux1.npy --out $R --label ${v%%:*} > $OUT/${v%%:*}.log 2>&1
    echo "${v%%:*} rc=$? ended $(date +%s.%N | cut -c1-12) at ${SECONDS}s"; grep -h "destroyed" $OUT/${v%%:*}.log
  done
  for f in $OUT/*.log; do tail -n 2 "$f" | cut -c1-400; done
  ;;
fluxring)  # issue 46: diffusers' ring attention in place of Ulysses on the same 2 ranks. Run at c730cdc, before the
  # product took the ring, with bench flags since folded into it (--cp-ring --attention _native_cudnn --overlap-gather is
  # now --ring-degree 2): labels flux-r2-{flash,cudnn}-overlap, flux-r2-flash, flux-u2-cudnn, flux-1gpu-cudnn
  echo "see fluxringq: the ring is the product's --ring-degree since c730cdc"
  ;;
fluxringq)  # issue 46: a ring-only FLUX group as the product splits it (diffusers' ring, cuDNN's attention, the
  # gather overlapped, each transformer call one CUDA graph): bare against 1 GPU and Ulysses 2, without the overlap,
  # through the queue, a rank killed mid-job
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  C=vae-fp16,compile-blocks
  DIFFQ_SPEEDUPS=$C timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 --save /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  for v in "flux-r2-product:--ring-degree 2" "flux-u2-product:--ulysses-degree 2" \
           "flux-r2-nooverlap:--ring-degree 2 --no-overlap-gather"; do
    timeout 120 $TR --nproc-per-node 2 bench/group.py $F --runs 3 ${v#*:} --compare /tmp/flux1.npy --out $R \
      --label ${v%%:*} > $OUT/${v%%:*}.log 2>&1; echo "${v%%:*} rc=$? at ${SECONDS}s"
    grep -h "split: " $OUT/${v%%:*}.log | head -1 | cut -c1-200
  done
  [ $SECONDS -lt 330 ] && { timeout 150 python3 bench/group_queue.py --gpus 2 $F --degrees "--ring-degree 2" \
    --jobs 8 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  [ $SECONDS -lt 400 ] && { FAULT_MODEL=flux-random FAULT_DEGREES="--ring-degree 2" \
    FAULT_ENQUEUE="--steps 28 --guidance 3.5" timeout 140 bash bench/group_fault.sh > /dev/null 2>&1; \
    echo "fault rc=$? at ${SECONDS}s"; cat $OUT/fault.txt; }
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl --exclude fault.txt . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxring3)  # issue 46: where a ring rank's time goes (1 GPU and the ring under the profiler), and NCCL's SMs beside
  # the local attention: its CTA policy (1 = efficiency) and fewer channels
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 \
    --save /tmp/flux1.npy --out $R --label flux-1gpu-compiled --profile /tmp/prof-1 > $OUT/flux1c.log 2>&1
  echo "1 GPU rc=$? at ${SECONDS}s"
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 130 $TR --nproc-per-node 2 bench/group.py $F --runs 3 --ring-degree 2 \
    --compare /tmp/flux1.npy --out $R --label flux-r2-product --profile /tmp/prof-r2 > $OUT/flux-r2-product.log 2>&1
  echo "ring, profiled rc=$? at ${SECONDS}s"; grep -h "nChannels\|Channel 0[0-9]/" $OUT/flux-r2-product.log | head -4 | cut -c1-200
  for v in "flux-r2-cta1:NCCL_CTA_POLICY=1" "flux-r2-ch8:NCCL_MAX_NCHANNELS=8" "flux-r2-ch16:NCCL_MAX_NCHANNELS=16" \
           "flux-r2-product-again:DIFFQ_NOTHING=1"; do
    [ $SECONDS -lt 480 ] || break
    env ${v#*:} timeout 110 $TR --nproc-per-node 2 bench/group.py $F --runs 3 --ring-degree 2 --compare /tmp/flux1.npy \
      --out $R --label ${v%%:*} > $OUT/${v%%:*}.log 2>&1; echo "${v%%:*} rc=$? at ${SECONDS}s"
  done
  for d in prof-1 prof-r2; do mkdir -p $OUT/$d; cp /tmp/$d/rank*.json $OUT/$d/ 2>/dev/null; done
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -rf $OUT/*.log $OUT/prof-* && mv /tmp/logs.tgz $OUT/
  ;;
fluxring4)  # issue 46: the ring's own attention (worker/group/ring_attention.py: keys and values laid out once, in
  # the buffer the gather sends) against diffusers' ring and one GPU; profiled; through the queue
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 \
    --save /tmp/flux1.npy --out $R --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  timeout 130 $TR --nproc-per-node 2 bench/group.py $F --runs 3 --ring-degree 2 --compare /tmp/flux1.npy --out $R \
    --label flux-r2-own --profile /tmp/prof-r2 > $OUT/flux-r2-own.log 2>&1; echo "ring (own attention), profiled rc=$? at ${SECONDS}s"
  grep -h "split: " $OUT/flux-r2-own.log | head -1 | cut -c1-200
  for v in "flux-r2-diffusers:--diffusers-ring" "flux-r2-own-again:"; do
    timeout 110 $TR --nproc-per-node 2 bench/group.py $F --runs 3 --ring-degree 2 ${v#*:} --compare /tmp/flux1.npy \
      --out $R --label ${v%%:*} > $OUT/${v%%:*}.log 2>&1; echo "${v%%:*} rc=$? at ${SECONDS}s"
  done
  [ $SECONDS -lt 400 ] && { timeout 130 python3 bench/group_queue.py --gpus 2 $F --degrees "--ring-degree 2" \
    --jobs 8 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  mkdir -p $OUT/prof-r2; cp /tmp/prof-r2/rank*.json $OUT/prof-r2/ 2>/dev/null
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl --exclude summary.txt . 2>/dev/null && rm -rf $OUT/*.log $OUT/prof-* && mv /tmp/logs.tgz $OUT/
  ;;
fluxring5)  # issue 46: after fluxring4 on the same machine: the ring's own attention at 2048² against one GPU, and a
  # rank killed mid-job
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks timeout 200 $TR --nproc-per-node 1 bench/group.py $F --size 2048 --runs 2 \
    --save /tmp/flux2k.npy --out $R --label flux-2048-1gpu > $OUT/f2k-1.log 2>&1; echo "2048 1 GPU rc=$? at ${SECONDS}s"
  timeout 160 $TR --nproc-per-node 2 bench/group.py $F --size 2048 --ring-degree 2 --runs 2 --compare /tmp/flux2k.npy \
    --out $R --label flux-2048-r2-own > $OUT/f2k-ring.log 2>&1; echo "2048 ring 2 rc=$? at ${SECONDS}s"
  grep -h "split: " $OUT/f2k-ring.log | head -1 | cut -c1-250
  [ $SECONDS -lt 400 ] && { FAULT_MODEL=flux-random FAULT_DEGREES="--ring-degree 2" \
    FAULT_ENQUEUE="--steps 28 --guidance 3.5" timeout 140 bash bench/group_fault.sh > /dev/null 2>&1; \
    echo "fault rc=$? at ${SECONDS}s"; cat $OUT/fault.txt; }
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl --exclude fault.txt --exclude summary.txt . 2>/dev/null && \
    rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
flux4own)  # issue 46: FLUX 1024² on 4 GPUs: the product's ring of 4 with its own attention (since fluxring4) against
  # diffusers' ring of 4 and one GPU
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 \
    --save /tmp/flux1.npy --out $R --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  for v in "flux-r4-own:" "flux-r4-diffusers:--diffusers-ring"; do
    timeout 130 $TR --nproc-per-node 4 bench/group.py $F --ring-degree 4 --runs 3 ${v#*:} --compare /tmp/flux1.npy \
      --out $R --label ${v%%:*} > $OUT/${v%%:*}.log 2>&1; echo "${v%%:*} rc=$? at ${SECONDS}s"
  done
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl --exclude summary.txt . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxring6)  # issue 46: do NCCL's kernels slow the compute they overlap? The ring (its own attention) profiled with
  # the gather overlapped (the product) and not: each kind of kernel's time, beside NCCL or alone
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  for v in "flux-r2-own:" "flux-r2-own-nooverlap:--no-overlap-gather"; do
    timeout 150 $TR --nproc-per-node 2 bench/group.py $F --runs 2 --ring-degree 2 ${v#*:} --out $R --label ${v%%:*} \
      --profile /tmp/prof-${v%%:*} > $OUT/${v%%:*}.log 2>&1; echo "${v%%:*} rc=$? at ${SECONDS}s"
  done
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl --exclude summary.txt . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
copygather)  # issue 46: NCCL's all-gather against a pull by the copy engines, alone and beside GEMMs (bench/copy_gather.py)
  timeout 300 $TR --nproc-per-node 2 bench/copy_gather.py --out $R > $OUT/copygather.log 2>&1; echo "copy_gather rc=$?"
  ;;
fluxring7)  # issue 46: the ring's peers' keys and values pulled by the copy engines (bench/peer_gather.py,
  # --pull-gather) against NCCL's all-gather (the product's) and one GPU; the pull profiled. On 2026-11-28 the pull was
  # the product's default for this one call (h200x2-fluxring7-call.jsonl: NCCL's runs passed a flag, and its queue
  # line, 8 one-image jobs, is the pull's); here each is what the flags say
  ring_ab flux-r2-pull --pull-gather flux-r2-nccl "" profile
  mkdir -p $OUT/prof-r2; cp /tmp/prof-r2/rank*.json $OUT/prof-r2/ 2>/dev/null
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl --exclude summary.txt . 2>/dev/null && rm -rf $OUT/*.log $OUT/prof-* && mv /tmp/logs.tgz $OUT/
  ;;
fluxwhere)  # issue 46: FLUX 1024², one GPU and the product's ring of 2 under the profiler, each kind's heaviest
  # kernels by name (bench/rank_profile.py's top_kernels): what a ring rank runs whole that one GPU runs once
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 2 \
    --save /tmp/flux1.npy --out $R --label flux-1gpu-compiled --profile /tmp/prof-1 > $OUT/flux1c.log 2>&1
  echo "1 GPU rc=$? at ${SECONDS}s"
  timeout 130 $TR --nproc-per-node 2 bench/group.py $F --runs 2 --ring-degree 2 --compare /tmp/flux1.npy --out $R \
    --label flux-r2-product --profile /tmp/prof-r2 > $OUT/flux-r2-product.log 2>&1; echo "ring rc=$? at ${SECONDS}s"
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxring8)  # issue 46: the ring's attention handed views of tokens-first memory (--ring-bshd, bench/ring_bshd.py)
  # against the product's heads-first copies, alternated, and one GPU; the views profiled. In the 2026-11-28 call
  # (h200x2-fluxring8-call.jsonl) the views were the product's for that call and the copies passed a flag; here each
  # is what the flags say
  ring_ab flux-r2-bshd --ring-bshd flux-r2-bhsd "" profile
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxdecode)  # issue 46: a token-split group's decoder split by rows over its ranks (worker/group/split_decode.py,
  # the product's) against every rank decoding the whole latent (--whole-decode), alternated, and one GPU; then 2048²
  ring_ab flux-r2-splitdecode "" flux-r2-wholedecode --whole-decode
  grep -h "split: " $OUT/flux-r2-splitdecode.log | head -1 | cut -c1-260
  for v in "flux-2048-r2-splitdecode:" "flux-2048-r2-wholedecode:--whole-decode"; do
    [ $SECONDS -lt 280 ] && { timeout 150 $TR --nproc-per-node 2 bench/group.py $F --size 2048 --runs 2 --ring-degree 2 \
      ${v#*:} --out $R --label ${v%%:*} > $OUT/${v%%:*}.log 2>&1; echo "${v%%:*} rc=$? at ${SECONDS}s"; }
  done
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxmod)  # issue 46: FLUX's modulation vectors for all of an image's steps at its first (modulation-once,
  # worker/pipelines/modulation.py), on one GPU and in the ring of 2, each against the same levers without it, alternated
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  C=vae-fp16,compile-blocks G=vae-fp16,compile-unet,compile-vae,compile-blocks,cuda-graphs
  one() { DIFFQ_SPEEDUPS=$2 timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 $3 --out $R --label $1 \
    > $OUT/$1.log 2>&1; echo "$1 rc=$? at ${SECONDS}s"; }
  two() { DIFFQ_SPEEDUPS=$2 timeout 130 $TR --nproc-per-node 2 bench/group.py $F --runs 3 --ring-degree 2 ${3:-} \
    --compare /tmp/flux1.npy --out $R --label $1 > $OUT/$1.log 2>&1; echo "$1 rc=$? at ${SECONDS}s"; }
  one flux-1gpu-compiled $C "--save /tmp/flux1.npy"
  one flux-1gpu-modonce $C,modulation-once "--compare /tmp/flux1.npy"
  if [ "$(nvidia-smi -L | wc -l)" -lt 2 ]; then  # one GPU lent: its own A/B twice
    one flux-1gpu-compiled-again $C "--compare /tmp/flux1.npy"
    one flux-1gpu-modonce-again $C,modulation-once "--compare /tmp/flux1.npy"
    tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
    exit 0
  fi
  two flux-r2-without $G
  two flux-r2-modonce $G,modulation-once
  two flux-r2-whole $G,modulation-once --ring-whole  # the experiment: one attention over all keys, no merge
  [ $SECONDS -lt 380 ] && two flux-r2-without-again $G
  [ $SECONDS -lt 420 ] && two flux-r2-modonce-again $G,modulation-once
  [ $SECONDS -lt 460 ] && two flux-r2-whole-again $G,modulation-once --ring-whole
  [ $SECONDS -lt 500 ] && one flux-1gpu-modonce-again $C,modulation-once "--compare /tmp/flux1.npy"
  grep -h "modulation-once\|split: " $OUT/flux-r2-modonce.log | head -3 | cut -c1-260
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxmerge)  # issue 46: the ring's last merge as one Triton kernel that writes the tokens-first layout (the product's,
  # worker/group/attention_merge.py) against the merge in torch ops fused by Inductor into the kernel after the
  # attention (--ring-torch-merge), alternated, and one GPU; the kernel's first run profiled by kernel name
  ring_ab flux-r2-mergekernel "" flux-r2-torchmerge --ring-torch-merge profile
  grep -h "split: " $OUT/flux-r2-mergekernel.log | head -1 | cut -c1-260
  [ $SECONDS -lt 400 ] && { timeout 150 python3 bench/group_queue.py --gpus 2 $F --degrees "--ring-degree 2" \
    --jobs 8 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
exitq)  # after 2026-11-28's exit by os._exit (worker/group/cli.py's _finish): the FLUX ring of 2 (NCCL, the gather
  # a functional collective) and the SDXL CFG pair (CUDA graphs holding NCCL's collectives) through the queue, each
  # group's exit code and how long after its last job it was gone
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  timeout 200 python3 bench/group_queue.py --gpus 2 $F --degrees "--ring-degree 2" --jobs 8 --out $R \
    > $OUT/queue-flux.log 2>&1; echo "flux ring queue rc=$? at ${SECONDS}s"
  timeout 200 python3 bench/group_queue.py --gpus 2 $S --degrees=--cfg-parallel --jobs 8 --out $R \
    > $OUT/queue-sdxl.log 2>&1; echo "sdxl pair queue rc=$? at ${SECONDS}s"
  grep -h "terminate\|exitcode\|Traceback" $OUT/queue-*.log | head -5
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
pairparts)  # issue 46, one GPU: an SDXL CFG pair's serial parts at batch 1 (bench/pair_parts.py): the decoder at
  # the whole latent's rows and at a rank's half, eager and compiled; the split twin compiled with its collectives
  # over a one-rank NCCL group; the prompt's encode eager and with the text encoders compiled
  export TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  timeout 520 python3 bench/pair_parts.py --out $R > $OUT/parts.log 2>&1; echo "parts rc=$? at ${SECONDS}s"
  grep -h -i -E "error|Traceback" $OUT/parts.log | head -5
  ;;
decodemem)  # issue 46, one GPU: a FLUX group rank's split decode against one GPU's whole decode (bench/decode_memory.py),
  # 1024² and 2048², peak memory and time, the split GroupNorm in parts (the product) and over the whole activation (before)
  # (then compiled, as compile-vae compiles SDXL's: is it a lever for FLUX's decoder on one GPU and on a rank?)
  export TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  timeout 200 python3 bench/decode_memory.py --out $R > $OUT/decode.log 2>&1; echo "decode rc=$? at ${SECONDS}s"
  timeout $((540 - SECONDS)) python3 bench/decode_memory.py --out $R --compiled > $OUT/decode-compiled.log 2>&1
  echo "decode compiled rc=$? at ${SECONDS}s"
  grep -h -i -E "error|Traceback" $OUT/decode*.log | head -5
  ;;
fluxvae)  # issue 46, one GPU: FLUX's decoder compiled (compile-vae, as SDXL's) on one GPU, each against the DiT's
  # defaults without it, alternated at 1024² (3 calls each), then at 2048² once each (time, peak memory, phases)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  A=vae-fp16,compile-blocks,modulation-once
  for v in "without|$A|--save /tmp/flux1.npy" "with|$A,compile-vae|--compare /tmp/flux1.npy" \
      "without-again|$A|--compare /tmp/flux1.npy" "with-again|$A,compile-vae|--compare /tmp/flux1.npy"; do
    IFS='|' read -r label levers images <<< "$v"
    DIFFQ_SPEEDUPS=$levers timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 $images --out $R \
      --label flux-1gpu-$label > $OUT/$label.log 2>&1; echo "$label rc=$? at ${SECONDS}s"
  done
  for v in "without|$A|--save /tmp/flux2k.npy" "with|$A,compile-vae|--compare /tmp/flux2k.npy"; do
    IFS='|' read -r label levers images <<< "$v"
    [ $SECONDS -lt 400 ] && { DIFFQ_SPEEDUPS=$levers timeout $((545 - SECONDS)) $TR --nproc-per-node 1 bench/group.py $F \
      --size 2048 --runs 1 $images --out $R --label flux-2048-1gpu-$label > $OUT/2048-$label.log 2>&1
      echo "2048 $label rc=$? at ${SECONDS}s"; }
  done
  grep -h "speedups: " $OUT/*.log | cut -c1-200 | sort | uniq -c | head -8
  ;;
fluxvaeq)  # issue 46, one GPU: a FLUX single worker through the queue (8 one-image jobs), the DiT's levers without
  # compile-vae, then auto (with it since 2026-11-29): the lever through the worker's warm-up and precompiled files
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  flux_workers "without:vae-fp16,compile-blocks,modulation-once" "auto:auto"
  grep -h "speedups: \|compiled for\|precompiled" $OUT/*.log | cut -c1-240 | sort | uniq | head -12
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxphases)  # issue 46, one GPU: a FLUX image's phases since its decode is timed apart (it was reported as 0 s),
  # the DiT's defaults (compile-vae among them since 2026-11-29), 1024² and 2048²
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  for size in 1024 2048; do
    DIFFQ_SPEEDUPS=vae-fp16,compile-blocks,compile-vae,modulation-once timeout 200 $TR --nproc-per-node 1 bench/group.py $F \
      --size $size --runs 2 --out $R --label flux-$size-1gpu-phases > $OUT/phases-$size.log 2>&1; echo "$size rc=$? at ${SECONDS}s"
  done
  ;;
encgraphs)  # issue 46, one GPU: the prompt's encode with the text encoders' calls replayed as CUDA graphs
  # (encoder-graphs; bench/encode_graphs.py: SDXL's CLIPs, FLUX's CLIP and T5, eager and graphed alternated), then one
  # SDXL image at batch 1 with a CFG pair's levers on one GPU without and with it, alternated; FLUX 1024² the same
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  timeout 200 python3 bench/encode_graphs.py --out $R > $OUT/encode.log 2>&1; echo "encode rc=$? at ${SECONDS}s"
  grep -h -i -E "error|Traceback|encoder-graphs" $OUT/encode.log | head -5
  G=vae-fp16,compile-unet,compile-vae,cuda-graphs
  for v in "without|$G|--save /tmp/sdxl1.npy" "with|$G,encoder-graphs|--compare /tmp/sdxl1.npy" \
      "without-again|$G|--compare /tmp/sdxl1.npy" "with-again|$G,encoder-graphs|--compare /tmp/sdxl1.npy"; do
    IFS='|' read -r label levers images <<< "$v"
    [ $SECONDS -lt 400 ] && { DIFFQ_SPEEDUPS=$levers timeout 200 $TR --nproc-per-node 1 bench/group.py $S --batches 1 \
      --runs 5 $images --out $R --label sdxl-1gpu-$label > $OUT/sdxl-$label.log 2>&1; echo "sdxl $label rc=$? at ${SECONDS}s"; }
  done
  A=vae-fp16,compile-blocks,compile-vae,modulation-once
  for v in "without|$A|--save /tmp/flux1.npy" "with|$A,encoder-graphs|--compare /tmp/flux1.npy"; do
    IFS='|' read -r label levers images <<< "$v"
    [ $SECONDS -lt 440 ] && { DIFFQ_SPEEDUPS=$levers timeout $((560 - SECONDS)) $TR --nproc-per-node 1 bench/group.py $F \
      --runs 3 $images --out $R --label flux-1gpu-$label > $OUT/flux-$label.log 2>&1; echo "flux $label rc=$? at ${SECONDS}s"; }
  done
  grep -h -E "encoder-graphs:|cuda-graphs:" $OUT/*.log | sort | uniq -c | head -8
  ;;
encgraphsq)  # issue 46, one GPU: encoder-graphs through a single worker's path (warm-up, memory probe, threads): an SDXL
  # worker, 8 one-image jobs, auto with cuda-graphs (a latency worker's levers) without and with it; then FLUX 1024²
  # bare without and with it again (encgraphs ran each once)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  queue_workers sdxl "$S" "graphs:auto,cuda-graphs" "encoders:auto,cuda-graphs,encoder-graphs"
  A=vae-fp16,compile-blocks,compile-vae,modulation-once
  for v in "without|$A|--save /tmp/flux1.npy" "with|$A,encoder-graphs|--compare /tmp/flux1.npy" \
      "without-again|$A|--compare /tmp/flux1.npy"; do
    IFS='|' read -r label levers images <<< "$v"
    [ $SECONDS -lt 440 ] && { DIFFQ_SPEEDUPS=$levers timeout $((560 - SECONDS)) $TR --nproc-per-node 1 bench/group.py $F \
      --runs 3 $images --out $R --label flux-1gpu-$label > $OUT/flux-$label.log 2>&1; echo "flux $label rc=$? at ${SECONDS}s"; }
  done
  grep -h -E "encoder-graphs|cuda-graphs|speedups: |compiled for" $OUT/worker*.log $OUT/*/*.log 2>/dev/null | cut -c1-220 | sort | uniq -c | head -12
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fusedrows)  # issue 46, one GPU: does fuse-qkv fill the GPU better at a CFG rank's one row than at one GPU's two? SDXL's
  # 32x32-level transformer (10 of the 60 blocks there; bench/unet_levers.py --part down2), then the whole UNet at one
  # row, each under CUDA graphs without and with q, k and v as one product
  for r in 1 2; do
    timeout 150 python3 bench/unet_levers.py --out $OUT/part$r.jsonl --rows $r --part down2 --repeats 30 --budget-s 140 \
      --min-left-s 20 --variants cudagraphs-fp16,fusedgraphs-fp16,cudagraphs-fp16 > $OUT/part$r.log 2>&1; echo "part rows $r rc=$? at ${SECONDS}s"
  done
  timeout $((560 - SECONDS)) python3 bench/unet_levers.py --out $OUT/unet1.jsonl --rows 1 --budget-s $((550 - SECONDS)) \
    --min-left-s 150 --variants cudagraphs-fp16,fusedgraphs-fp16 > $OUT/unet1.log 2>&1; echo "unet rows 1 rc=$? at ${SECONDS}s"
  cat $OUT/part1.jsonl $OUT/part2.jsonl $OUT/unet1.jsonl > $R 2>/dev/null; grep -h -i -E "error|Traceback" $OUT/*.log | head -5
  ;;
ringcalls)  # issue 46, one GPU: a ring rank spends 0.08 s an image in attention over half of one GPU's; its two cuDNN
  # calls of half the keys and the merge against one call of all the keys (heads-first, and through tokens-first views
  # of memory laid out as the gather leaves it), one step's 57 layers as one CUDA graph (bench/ring_calls.py)
  python3 bench/ring_calls.py --out $R > $OUT/calls.log 2>&1; echo "calls rc=$? at ${SECONDS}s"
  ;;
done2)  # issue 46's "done means" on a pair: the first of four calls back to back on one machine (one compile cache
  # in /tmp); run on 2 H200s on 2026-11-29 (h200x2-done2-call: ended at 531 s). SDXL at batch 1: one GPU with the
  # worker's defaults (W, CUDA_DEFAULT_SPEEDUPS: empty-negative among them since 2026-11-27), the CFG pair (the group's
  # defaults), one GPU with the pair's levers (P), then the pair through the queue (8 one-image jobs); the ratio's two
  # runs first. Timed on one H200 (2026-11-29, the pair's runs failing at once, cold cache): W's run ended at 148 s (its
  # compile 123 s); P, which compiles its own graphs, did not end within 120 s (hence 200)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  W=vae-fp16,compile-unet,compile-vae,empty-negative P=vae-fp16,compile-unet,compile-vae,cuda-graphs,encoder-graphs
  nvidia-smi topo -m > $OUT/topo.txt 2>&1
  DIFFQ_SPEEDUPS=$W timeout 250 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 3 --save /tmp/sdxl1.npy \
    --out $R --label sdxl-1gpu-worker-levers > $OUT/1gpu-worker-levers.log 2>&1; echo "1 GPU worker-levers rc=$? at ${SECONDS}s"
  timeout 200 $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 1 --runs 5 --compare /tmp/sdxl1.npy \
    --out $R --label sdxl-cfg2 > $OUT/cfg2.log 2>&1; echo "CFG 2 rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 400 ] && { DIFFQ_SPEEDUPS=$P timeout 200 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 3 \
    --compare /tmp/sdxl1.npy --out $R --label sdxl-1gpu-pair-levers > $OUT/1gpu-pair-levers.log 2>&1
    echo "1 GPU pair-levers rc=$? at ${SECONDS}s"; }
  [ $SECONDS -lt 480 ] && { timeout $((575 - SECONDS)) python3 bench/group_queue.py --gpus 2 $S --degrees=--cfg-parallel \
    --jobs 8 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
done2q)  # issue 46 on a pair, one call (1,065 s of device time were left): the SDXL CFG pair's queue share since rank 0's
  # answer stays in its memory and the pipeline's device is pinned; one GPU with the pair's levers (P), the pair bare,
  # then the pair through the queue (10 one-image jobs)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  P=vae-fp16,compile-unet,compile-vae,cuda-graphs,encoder-graphs
  nvidia-smi topo -m > $OUT/topo.txt 2>&1
  DIFFQ_SPEEDUPS=$P timeout 220 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 3 --save /tmp/sdxl1.npy \
    --out $R --label sdxl-1gpu-pair-levers > $OUT/1gpu-pair-levers.log 2>&1; echo "1 GPU pair-levers rc=$? at ${SECONDS}s"
  timeout 200 $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 1 --runs 5 --compare /tmp/sdxl1.npy \
    --out $R --label sdxl-cfg2 > $OUT/cfg2.log 2>&1; echo "CFG 2 rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 440 ] && { timeout $((540 - SECONDS)) python3 bench/group_queue.py --gpus 2 $S --degrees=--cfg-parallel \
    --jobs 10 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
done2b)  # the second call (right after done2; on 2 H200s it ended at 424 s): FLUX 1024² and 2048², one GPU with the
  # ring's levers against the ring of 2
  # (the group's defaults); the ring through the queue. Timed on one H200 (the ring's runs failing at once, cold cache):
  # one GPU's 1024² run ended at 83 s (first call 52 s), its 2048² run at 192 s (first call 65 s)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  L=vae-fp16,compile-blocks,compile-vae,modulation-once,encoder-graphs
  for size in 1024 2048; do
    runs=$([ $size = 1024 ] && echo 3 || echo 1)
    [ $SECONDS -lt 300 ] && { DIFFQ_SPEEDUPS=$L timeout 200 $TR --nproc-per-node 1 bench/group.py $F --size $size --runs $runs \
      --save /tmp/flux$size.npy --out $R --label flux-$size-1gpu > $OUT/flux$size-1.log 2>&1; echo "$size 1 GPU rc=$? at ${SECONDS}s"
      timeout 160 $TR --nproc-per-node 2 bench/group.py $F --size $size --ring-degree 2 --runs $runs --compare /tmp/flux$size.npy \
        --out $R --label flux-$size-r2 > $OUT/flux$size-r2.log 2>&1; echo "$size ring 2 rc=$? at ${SECONDS}s"; }
  done
  [ $SECONDS -lt 450 ] && { timeout $((580 - SECONDS)) python3 bench/group_queue.py --gpus 2 $F --degrees "--ring-degree 2" \
    --jobs 8 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
done2c)  # the third call: SDXL at batch 4, one GPU with the worker's defaults against the CFG pair. On 2 H200s
  # (2026-11-29, after done2 and done2b on the same machine) one GPU's run ended at 213 s (first call 174 s) and the
  # pair's at 416 s (first call 169 s): nothing else fits, so data parallel and the pair's levers are done2d
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  W=vae-fp16,compile-unet,compile-vae,empty-negative
  DIFFQ_SPEEDUPS=$W timeout 250 $TR --nproc-per-node 1 bench/group.py $S --batches 4 --runs 3 --save /tmp/sdxl4.npy \
    --out $R --label sdxl-1gpu-b4-worker-levers > $OUT/1gpu-b4-worker-levers.log 2>&1; echo "1 GPU b4 worker-levers rc=$? at ${SECONDS}s"
  timeout 250 $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 4 --runs 3 --compare /tmp/sdxl4.npy \
    --out $R --label sdxl-cfg2-b4 > $OUT/cfg2-b4.log 2>&1; echo "CFG 2 b4 rc=$? at ${SECONDS}s"
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
done2d)  # the fourth call: data parallel, one SDXL worker per GPU (its defaults) against one, jobs of 4 images (the
  # shape done2c compiled: a worker reused a bench's graphs on one H200, 0 compiles, 46 s from launch to exit for 24
  # images); then one GPU with the pair's levers at batch 4 against done2c's images (its own compile: 170 s or more)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  P=vae-fp16,compile-unet,compile-vae,cuda-graphs,encoder-graphs
  timeout 300 python3 bench/e2e_queue.py --out $R --gpu-counts 1,2 --images-per-gpu 24 --chunk 4 \
    --tag data-parallel --timeout 240 --logs $OUT > $OUT/scaling.log 2>&1; echo "scaling rc=$? at ${SECONDS}s"
  [ -f /tmp/sdxl4.npy ] && [ $SECONDS -lt 330 ] && { DIFFQ_SPEEDUPS=$P timeout $((585 - SECONDS)) $TR --nproc-per-node 1 \
    bench/group.py $S --batches 4 --runs 3 --compare /tmp/sdxl4.npy --out $R --label sdxl-1gpu-b4-pair-levers \
    > $OUT/1gpu-b4-pair-levers.log 2>&1; echo "1 GPU b4 pair-levers rc=$? at ${SECONDS}s"; }
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
queue1)  # issue 46, one GPU (a pair was not lent): where a one-image SDXL job's time outside its pipeline call goes. The
  # CFG pair's queue share was 3.5 % on 2 H200s (24 ms a job, done2). A one-rank group with the pair's levers: the bare
  # call (bench/group.py), then through the queue (10 one-image jobs) plain and with rank 0's main thread timed by part
  # (bench/group_variant.py timed), plain again
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  P=vae-fp16,compile-unet,compile-vae,cuda-graphs,encoder-graphs
  DIFFQ_SPEEDUPS=$P timeout 260 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 5 --out $R \
    --label sdxl-1gpu-pair-levers > $OUT/1gpu-pair-levers.log 2>&1; echo "1 GPU pair-levers rc=$? at ${SECONDS}s"
  for v in "" timed ""; do
    [ $SECONDS -lt 470 ] && { DIFFQ_SPEEDUPS=$P DIFFQ_BENCH_TIMED=$OUT/timed.jsonl timeout $((580 - SECONDS)) \
      python3 bench/group_queue.py --gpus 1 $S --jobs 10 ${v:+--variant $v} --out $R > $OUT/queue${v:+-$v}.log 2>&1
      echo "queue ${v:-plain} rc=$? at ${SECONDS}s"; }
  done
  [ -f $OUT/timed.jsonl ] && sed 's/^/{"kind": "timed", /; s/^{"kind": "timed", {/{"kind": "timed", /' $OUT/timed.jsonl >> $R
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
rounding2)  # issue 46, 2 GPUs: a FLUX image's pixels rounded on the device (worker/pipelines/generate.py, since
  # 2026-11-29) against on the host as diffusers' PIL output does, alternated call by call in one process
  # (bench/group.py --alternate-rounding): one GPU with the ring's levers and the ring of 2, at 1024², then at 2048²
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  L=vae-fp16,compile-blocks,compile-vae,modulation-once,encoder-graphs
  for v in "1024|8|300" "2048|2|330"; do
    IFS='|' read -r size runs start <<< "$v"
    [ $SECONDS -lt $start ] && { DIFFQ_SPEEDUPS=$L timeout 200 $TR --nproc-per-node 1 bench/group.py $F --size $size \
      --runs $runs --alternate-rounding --save /tmp/flux$size.npy --out $R --label flux-$size-1gpu-rounding \
      > $OUT/flux$size-1.log 2>&1; echo "$size 1 GPU rc=$? at ${SECONDS}s"
      timeout 160 $TR --nproc-per-node 2 bench/group.py $F --size $size --ring-degree 2 --runs $runs --alternate-rounding \
        --compare /tmp/flux$size.npy --out $R --label flux-$size-r2-rounding > $OUT/flux$size-r2.log 2>&1
      echo "$size ring 2 rc=$? at ${SECONDS}s"; }
  done
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
pinned1)  # issue 46, one GPU: the pipeline's execution device looked up once (worker/pipelines/pinned_device.py)
  # against diffusers' walk of every module on every ask, alternated call by call in one process (bench/group.py
  # --alternate-pinned): SDXL at batch 1 with the pair's levers, then through the queue (a one-rank group, 10 jobs),
  # then FLUX 1024² with the ring's levers
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  P=vae-fp16,compile-unet,compile-vae,cuda-graphs,encoder-graphs L=vae-fp16,compile-blocks,compile-vae,modulation-once,encoder-graphs
  DIFFQ_SPEEDUPS=$P timeout 280 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 10 --alternate-pinned --out $R \
    --label sdxl-1gpu-pair-levers-pinned > $OUT/sdxl.log 2>&1; echo "SDXL alternated rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 330 ] && { DIFFQ_SPEEDUPS=$P timeout 120 python3 bench/group_queue.py --gpus 1 $S --jobs 10 --out $R \
    > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  [ $SECONDS -lt 400 ] && { DIFFQ_SPEEDUPS=$L timeout $((580 - SECONDS)) $TR --nproc-per-node 1 bench/group.py $F --runs 6 \
    --alternate-pinned --out $R --label flux-1gpu-ring-levers-pinned > $OUT/flux.log 2>&1; echo "FLUX alternated rc=$? at ${SECONDS}s"; }
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
cfgsplit)  # issue 46, 2 GPUs (not run yet: one GPU was lent when it was built): the CFG pair at batch 1 with its one
  # image decoded split by rows (the product since 2026-11-29) against whole on both ranks (--whole-decode),
  # alternated, against one GPU with the worker's levers and with the pair's (cuda-graphs, encoder-graphs since the
  # encgraphs call); then through the queue
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  W=vae-fp16,compile-unet,compile-vae
  DIFFQ_SPEEDUPS=$W timeout 250 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 3 --save /tmp/sdxl1.npy \
    --out $R --label sdxl-1gpu-worker-levers > $OUT/sdxl1.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  DIFFQ_SPEEDUPS=$W,cuda-graphs,encoder-graphs timeout 120 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 3 \
    --compare /tmp/sdxl1.npy --out $R --label sdxl-1gpu-cuda-graphs > $OUT/sdxl1g.log 2>&1; echo "1 GPU, cuda-graphs rc=$? at ${SECONDS}s"
  for v in "sdxl-cfg2-split-decode|" "sdxl-cfg2-whole-decode|--whole-decode" "sdxl-cfg2-split-decode-again|" \
      "sdxl-cfg2-whole-decode-again|--whole-decode"; do
    IFS='|' read -r label flags <<< "$v"
    [ $SECONDS -lt 420 ] && { timeout 160 $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 1 --runs 5 \
      $flags --compare /tmp/sdxl1.npy --out $R --label $label > $OUT/$label.log 2>&1; echo "$label rc=$? at ${SECONDS}s"; }
  done
  [ $SECONDS -lt 480 ] && { timeout $((570 - SECONDS)) python3 bench/group_queue.py --gpus 2 $S --degrees=--cfg-parallel \
    --jobs 8 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxfusering)  # issue 46, 2 GPUs (not run yet: one GPU was lent when fuse-qkv came to FLUX): the ring of 2 with the
  # group's defaults, without and with fuse-qkv, alternated, against one GPU with the same levers but cuda-graphs
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks,compile-vae,modulation-once,encoder-graphs timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 \
    --save /tmp/flux1.npy --out $R --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  for v in "flux-r2-separate|auto" "flux-r2-fuseqkv|auto,fuse-qkv" "flux-r2-separate-again|auto" "flux-r2-fuseqkv-again|auto,fuse-qkv"; do
    IFS='|' read -r label levers <<< "$v"
    [ $SECONDS -lt 430 ] && { DIFFQ_SPEEDUPS=$levers timeout 130 $TR --nproc-per-node 2 bench/group.py $F --runs 3 \
      --ring-degree 2 --compare /tmp/flux1.npy --out $R --label $label > $OUT/$label.log 2>&1; echo "$label rc=$? at ${SECONDS}s"; }
  done
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fusering2)  # issue 46, 2 GPUs, after fluxfusering (2 H200s: the ring 2.181 → 2.143 s with fuse-qkv, and the second
  # process with it on a warm compile cache died of SIGSEGV on rank 0 before its first line): one GPU without and
  # with fuse-qkv; the ring with it three times (a cold cache, then warm), without it between; Python's stacks on
  # a fatal signal
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor PYTHONFAULTHANDLER=1
  L=vae-fp16,compile-blocks,compile-vae,modulation-once,encoder-graphs
  DIFFQ_SPEEDUPS=$L timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 --save /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  DIFFQ_SPEEDUPS=$L,fuse-qkv timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 --compare /tmp/flux1.npy \
    --out $R --label flux-1gpu-fuseqkv > $OUT/flux1f.log 2>&1; echo "1 GPU fuse-qkv rc=$? at ${SECONDS}s"
  for v in "flux-r2-fuseqkv|auto,fuse-qkv" "flux-r2-fuseqkv-warm|auto,fuse-qkv" "flux-r2-separate|auto" \
      "flux-r2-fuseqkv-warm2|auto,fuse-qkv"; do
    IFS='|' read -r label levers <<< "$v"
    [ $SECONDS -lt 450 ] && { DIFFQ_SPEEDUPS=$levers timeout 120 $TR --nproc-per-node 2 bench/group.py $F --runs 3 \
      --ring-degree 2 --compare /tmp/flux1.npy --out $R --label $label > $OUT/$label.log 2>&1; echo "$label rc=$? at ${SECONDS}s"; }
  done
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fusestarts)  # issue 46, 2 GPUs: the ring of 2 with fuse-qkv launched again and again (a cold compile cache, then
  # warm), Python's stacks on a fatal signal: does a rank die at load as one did in fluxfusering?
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor PYTHONFAULTHANDLER=1
  for i in 1 2 3 4 5 6 7 8; do
    [ $SECONDS -lt 480 ] && { DIFFQ_SPEEDUPS=auto,fuse-qkv timeout 110 $TR --nproc-per-node 2 bench/group.py $F --runs 1 \
      --ring-degree 2 --out $R --label flux-r2-fuseqkv-start$i > $OUT/start$i.log 2>&1; echo "start $i rc=$? at ${SECONDS}s"; }
  done
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fuse2048)  # issue 46, 2 GPUs: FLUX 2048², one GPU with the ring's levers against the ring of 2 with its defaults
  # (fuse-qkv among them since fusering2): time and peak memory, one call each
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks,compile-vae,modulation-once,encoder-graphs timeout 115 $TR --nproc-per-node 1 \
    bench/group.py $F --size 2048 --runs 1 --save /tmp/flux2048.npy --out $R --label flux-2048-1gpu > $OUT/1gpu.log 2>&1
  echo "1 GPU rc=$? at ${SECONDS}s"
  timeout $((270 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $F --size 2048 --ring-degree 2 --runs 1 \
    --compare /tmp/flux2048.npy --out $R --label flux-2048-r2-defaults > $OUT/r2.log 2>&1; echo "ring 2 rc=$? at ${SECONDS}s"
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxmodq)  # issue 46: after modulation-once, where one GPU's and a ring rank's time goes (bench/rank_profile.py, each
  # kind's heaviest kernels), and the product's ring through the queue (its overhead over the bare call)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks,modulation-once timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 2 \
    --save /tmp/flux1.npy --out $R --label flux-1gpu-modonce --profile /tmp/prof-1 > $OUT/flux1.log 2>&1
  echo "1 GPU rc=$? at ${SECONDS}s"
  timeout 130 $TR --nproc-per-node 2 bench/group.py $F --runs 2 --ring-degree 2 --compare /tmp/flux1.npy --out $R \
    --label flux-r2-product --profile /tmp/prof-r2 > $OUT/flux-r2-product.log 2>&1; echo "ring rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 400 ] && { timeout 150 python3 bench/group_queue.py --gpus 2 $F --degrees "--ring-degree 2" \
    --jobs 8 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl --exclude summary.txt . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxworker)  # issue 46: a FLUX single worker through the queue (8 one-image jobs) with --speedups auto as it was
  # (SDXL's levers, of which FLUX takes vae-fp16 only) and as it is now (a DiT's: compile-blocks, modulation-once)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  flux_workers "before:vae-fp16" "auto:auto"
  grep -h "speedups: \|offload auto" $OUT/*.log | cut -c1-240 | sort | uniq | head -8
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
fluxgraphs)  # issue 46: a FLUX Ulysses group replays each transformer call as one CUDA graph (cuda-graphs, in a
  # group's defaults) and drops the graphs before leaving its process group: speed, exit, fault
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  C=vae-fp16,compile-blocks
  DIFFQ_SPEEDUPS=$C timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 --save /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  DIFFQ_SPEEDUPS=$C timeout 120 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 3 \
    --compare /tmp/flux1.npy --out $R --label flux-u2-nographs > $OUT/flux2.log 2>&1; echo "Ulysses 2 without graphs rc=$? at ${SECONDS}s"
  timeout 120 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 3 --compare /tmp/flux1.npy --out $R \
    --label flux-u2-product > $OUT/flux2g.log 2>&1; echo "Ulysses 2, the group's defaults rc=$? at ${SECONDS}s"
  grep -h "split: \|destroyed" $OUT/flux2g.log | cut -c1-300
  [ $SECONDS -lt 330 ] && { timeout 150 python3 bench/group_queue.py --gpus 2 $F --degrees "--ulysses-degree 2" \
    --jobs 8 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  [ $SECONDS -lt 400 ] && { FAULT_MODEL=flux-random FAULT_DEGREES="--ulysses-degree 2" \
    FAULT_ENQUEUE="--steps 28 --guidance 3.5" timeout 140 bash bench/group_fault.sh > /dev/null 2>&1; \
    echo "fault rc=$? at ${SECONDS}s"; cat $OUT/fault.txt; }
  ;;
flux4g)  # issue 46: the product's FLUX split (diffusers' Ulysses, each transformer call one CUDA graph) on 4 GPUs;
  # measured on 4 H200s before it only with xDiT's split (flux4c: Ulysses 4 1.99x)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  C=vae-fp16,compile-blocks
  DIFFQ_SPEEDUPS=$C timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 --save /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  timeout 120 $TR --nproc-per-node 4 bench/group.py $F --ulysses-degree 4 --runs 3 --compare /tmp/flux1.npy --out $R \
    --label flux-u4-product > $OUT/flux4g.log 2>&1; echo "Ulysses 4, the group's defaults rc=$? at ${SECONDS}s"
  DIFFQ_SPEEDUPS=$C timeout 120 $TR --nproc-per-node 4 bench/group.py $F --ulysses-degree 4 --runs 3 \
    --compare /tmp/flux1.npy --out $R --label flux-u4-nographs > $OUT/flux4.log 2>&1; echo "Ulysses 4 without graphs rc=$? at ${SECONDS}s"
  timeout 120 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 3 --compare /tmp/flux1.npy --out $R \
    --label flux-u2-product > $OUT/flux2g.log 2>&1; echo "Ulysses 2, the group's defaults rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 400 ] && { timeout 140 python3 bench/group_queue.py --gpus 4 $F --degrees "--ulysses-degree 4" \
    --jobs 8 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  grep -h "split: " $OUT/flux4g.log | head -1 | cut -c1-250
  ;;
flux2048g)  # issue 46: FLUX 2048² as the product splits it now (measured 2026-11-26 under xDiT's split: 1.67x)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks timeout 200 $TR --nproc-per-node 1 bench/group.py $F --size 2048 --runs 2 \
    --save /tmp/flux2k.npy --out $R --label flux-2048-1gpu > $OUT/f2k-1.log 2>&1; echo "2048 1 GPU rc=$? at ${SECONDS}s"
  timeout 200 $TR --nproc-per-node 2 bench/group.py $F --size 2048 --ulysses-degree 2 --runs 2 --compare /tmp/flux2k.npy \
    --out $R --label flux-2048-u2-product > $OUT/f2k-u2.log 2>&1; echo "2048 Ulysses 2 (the group's defaults) rc=$? at ${SECONDS}s"
  grep -h "split: " $OUT/f2k-u2.log | head -1 | cut -c1-250
  ;;
flux2048r)  # issue 46: FLUX 2048² on 2 GPUs split as a ring (the product's --ring-degree 2) against Ulysses 2, one GPU
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks timeout 200 $TR --nproc-per-node 1 bench/group.py $F --size 2048 --runs 2 \
    --save /tmp/flux2k.npy --out $R --label flux-2048-1gpu > $OUT/f2k-1.log 2>&1; echo "2048 1 GPU rc=$? at ${SECONDS}s"
  for d in ring ulysses; do
    timeout 160 $TR --nproc-per-node 2 bench/group.py $F --size 2048 --$d-degree 2 --runs 2 --compare /tmp/flux2k.npy \
      --out $R --label flux-2048-${d:0:1}2-product > $OUT/f2k-$d.log 2>&1; echo "2048 $d 2 rc=$? at ${SECONDS}s"
  done
  ;;
flux4r)  # issue 46: FLUX 1024² on 4 GPUs as a ring of 4 (the product's --ring-degree 4) against Ulysses 4, one GPU
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 \
    --save /tmp/flux1.npy --out $R --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  for d in ring ulysses; do
    timeout 130 $TR --nproc-per-node 4 bench/group.py $F --$d-degree 4 --runs 3 --compare /tmp/flux1.npy \
      --out $R --label flux-${d:0:1}4-product > $OUT/flux4-$d.log 2>&1; echo "$d 4 rc=$? at ${SECONDS}s"
  done
  ;;
fluxsplit)  # issue 46: the product's FLUX Ulysses-only groups now split with diffusers' own Ulysses
  # (worker/group/token_split.py): 1 GPU, Ulysses 2 as the product runs it, xDiT's split for comparison, the
  # product through the queue (its overhead per job), then one CUDA graph per transformer call (bench only)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor DIFFQ_SPEEDUPS=vae-fp16,compile-blocks
  timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 --save /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  timeout 120 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 3 --compare /tmp/flux1.npy --out $R \
    --label flux-u2-product > $OUT/flux2.log 2>&1; echo "Ulysses 2 (product: diffusers) rc=$? at ${SECONDS}s"
  timeout 120 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 3 --xdit --compare /tmp/flux1.npy \
    --out $R --label flux-u2-xdit > $OUT/flux2x.log 2>&1; echo "Ulysses 2 (xDiT) rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 330 ] && { timeout $((450 - SECONDS)) python3 bench/group_queue.py --gpus 2 $F --degrees "--ulysses-degree 2" \
    --jobs 8 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  [ $SECONDS -lt 430 ] && { timeout $((520 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 3 \
    --graph-steps --compare /tmp/flux1.npy --out $R --label flux-u2-product-graphsteps > $OUT/flux2g.log 2>&1; \
    echo "Ulysses 2 (product), step graphs rc=$? at ${SECONDS}s"; }
  for f in $OUT/*.log; do tail -n 3 "$f"; done
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
flux4c)  # issue 46, 4 GPUs when lent: FLUX on 1 GPU compiled (the baseline), Ulysses 4 and 2 compiled, the same
  # levers (the group's auto), one compile cache; then Ulysses 4 through the queue (its overhead per job)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor DIFFQ_SPEEDUPS=vae-fp16,compile-blocks
  nvidia-smi topo -m > $OUT/topo.txt
  timeout 160 $TR --nproc-per-node 1 bench/group.py $F --runs 2 --save /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  timeout 160 $TR --nproc-per-node 4 bench/group.py $F --ulysses-degree 4 --runs 2 --compare /tmp/flux1.npy --out $R \
    --label flux-u4-compiled > $OUT/flux4c.log 2>&1; echo "Ulysses 4 rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 330 ] && { timeout 130 $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 2 \
    --compare /tmp/flux1.npy --out $R --label flux-u2-compiled > $OUT/flux2c.log 2>&1; echo "Ulysses 2 rc=$? at ${SECONDS}s"; }
  [ $SECONDS -lt 440 ] && { timeout $((530 - SECONDS)) python3 bench/group_queue.py --gpus 4 $F --degrees "--ulysses-degree 4" \
    --jobs 6 --out $R > $OUT/queue4c.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
graphs2)  # issue 46: the cuda-graphs lever (worker/pipelines/step_graphs.py) at batch 1: 1 GPU with the single
  # worker's levers without it and with it, the CFG pair with the group's defaults (which include it), bare and
  # through the queue (--burst: the group must exit by itself after its last job); one compile cache
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  W=vae-fp16,compile-unet,compile-vae
  nvidia-smi topo -m > $OUT/topo.txt 2>&1
  DIFFQ_SPEEDUPS=$W timeout 250 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 3 --save /tmp/sdxl1.npy \
    --out $R --label sdxl-1gpu-worker-levers > $OUT/sdxl1.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  DIFFQ_SPEEDUPS=$W,cuda-graphs timeout 120 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 3 \
    --compare /tmp/sdxl1.npy --out $R --label sdxl-1gpu-cuda-graphs > $OUT/sdxl1g.log 2>&1; echo "1 GPU, cuda-graphs rc=$? at ${SECONDS}s"
  timeout $((520 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 1 --runs 3 \
    --compare /tmp/sdxl1.npy --out $R --label sdxl-cfg2-group-default > $OUT/sdxl2.log 2>&1; echo "CFG 2 rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 470 ] && { timeout $((560 - SECONDS)) python3 bench/group_queue.py --gpus 2 $S --degrees=--cfg-parallel \
    --jobs 8 --out $R > $OUT/queue.log 2>&1; echo "queue rc=$? at ${SECONDS}s"; }
  for f in $OUT/*.log; do tail -n 3 "$f"; done
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
graphs4)  # issue 46: the same at batch 4 (run right after graphs2 on the same machine: one compile cache)
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  W=vae-fp16,compile-unet,compile-vae
  DIFFQ_SPEEDUPS=$W timeout 240 $TR --nproc-per-node 1 bench/group.py $S --batches 4 --runs 3 --save /tmp/sdxl4.npy \
    --out $R --label sdxl-1gpu-b4 > $OUT/b4-1.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  DIFFQ_SPEEDUPS=$W,cuda-graphs timeout 120 $TR --nproc-per-node 1 bench/group.py $S --batches 4 --runs 3 \
    --compare /tmp/sdxl4.npy --out $R --label sdxl-1gpu-b4-cuda-graphs > $OUT/b4-1g.log 2>&1; echo "1 GPU graphs rc=$? at ${SECONDS}s"
  timeout $((560 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 4 --runs 3 \
    --compare /tmp/sdxl4.npy --out $R --label sdxl-cfg2-b4-group-default > $OUT/b4-2.log 2>&1; echo "CFG 2 rc=$? at ${SECONDS}s"
  ;;
rowtune)  # issue 46: a CFG rank's UNet (1 row) does not fill an H100 (22.8 ms against 35.3 at 2 rows); do
  # Inductor's GEMM templates, tuned per shape, fill it better than cuBLAS? Both row counts at once, one GPU each
  for g in 0 1; do
    CUDA_VISIBLE_DEVICES=$g timeout 530 python3 bench/unet_levers.py --out $OUT/rows$((g + 1)).jsonl --rows $((g + 1)) \
      --budget-s 520 --min-left-s 60 --variants cudagraphs-fp16,gemmtune-fp16 > $OUT/rows$((g + 1)).log 2>&1 &
  done
  wait; cat $OUT/rows1.jsonl $OUT/rows2.jsonl > $R; grep -h -i -E "error|Traceback" $OUT/rows*.log | head
  ;;
blocktune)  # issue 46: the whole UNet's GEMM tuning does not finish in a call; one 32x32-level transformer
  # (10 blocks of the 60 that run there) at 1 and 2 rows, CUDA graphs without and with the tuned GEMMs
  env | grep -i -E "^TORCHINDUCTOR|^OMP" > $OUT/env.txt; nproc >> $OUT/env.txt
  for g in 0 1; do
    CUDA_VISIBLE_DEVICES=$g TORCHINDUCTOR_COMPILE_THREADS=${THREADS:-16} timeout ${BLOCK_S:-420} python3 bench/unet_levers.py \
      --out $OUT/block$((g + 1)).jsonl --rows $((g + 1)) --part down2 --repeats 30 --budget-s $((${BLOCK_S:-420} - 10)) \
      --min-left-s 30 --variants cudagraphs-fp16,gemmtune-fp16 > $OUT/block$((g + 1)).log 2>&1 &
  done
  wait; cat $OUT/block1.jsonl $OUT/block2.jsonl > $R; grep -h "benchmarking takes" $OUT/block*.log | head -3
  ;;
sdxl4)  # issue 46: SDXL at batch 4, 1 GPU against CFG parallel on 2 (each rank decodes half the images), the
  # single worker's levers on both, one compile cache
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor DIFFQ_SPEEDUPS=vae-fp16,compile-unet,compile-vae
  nvidia-smi topo -m > $OUT/topo.txt
  timeout 240 $TR --nproc-per-node 1 bench/group.py $S --batches 4 --runs 3 --save /tmp/sdxl4.npy --out $R \
    --label sdxl-1gpu-b4 > $OUT/sdxl1.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  timeout $((540 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 4 --runs 3 \
    --compare /tmp/sdxl4.npy --out $R --label sdxl-cfg2-b4 > $OUT/sdxl2.log 2>&1; echo "CFG 2 rc=$? at ${SECONDS}s"
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
cudagraphs1)  # issue 46: the fair baseline, 1 GPU under CUDA graphs too, then CFG parallel under them again
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor DIFFQ_SPEEDUPS=vae-fp16,compile-unet,compile-vae
  timeout 230 $TR --nproc-per-node 1 bench/group.py $S --batches 1 --runs 3 --cudagraphs --save /tmp/sdxl1.npy --out $R \
    --label sdxl-1gpu-cudagraphs > $OUT/sdxl1g.log 2>&1; echo "1 GPU, CUDA graphs rc=$? at ${SECONDS}s"
  timeout $((480 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $S --cfg-parallel --batches 1 --runs 3 --cudagraphs \
    --compare /tmp/sdxl1.npy --out $R --label sdxl-cfg2-cudagraphs > $OUT/sdxl2g.log 2>&1; echo "CFG 2, CUDA graphs rc=$? at ${SECONDS}s"
  tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
flux2048)  # issue 46: FLUX at 2048² (time and peak memory) on 1 GPU, Ulysses 2, and Ulysses 2 with xDiT's parallel
  # VAE, the group's levers (compiled blocks) on all; then 1024², 1 GPU against Ulysses 2 with the blocks under CUDA graphs
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor DIFFQ_SPEEDUPS=vae-fp16,compile-blocks
  nvidia-smi topo -m > $OUT/topo.txt
  timeout 200 $TR --nproc-per-node 1 bench/group.py $F --size 2048 --runs 1 --save /tmp/flux2k.npy --out $R \
    --label flux-2048-1gpu > $OUT/f2k-1.log 2>&1; echo "2048 1 GPU rc=$? at ${SECONDS}s"
  timeout 150 $TR --nproc-per-node 2 bench/group.py $F --size 2048 --ulysses-degree 2 --runs 1 --compare /tmp/flux2k.npy \
    --out $R --label flux-2048-u2 > $OUT/f2k-u2.log 2>&1; echo "2048 Ulysses 2 rc=$? at ${SECONDS}s"
  timeout 120 $TR --nproc-per-node 2 bench/group.py $F --size 2048 --ulysses-degree 2 --parallel-vae --runs 1 \
    --compare /tmp/flux2k.npy --out $R --label flux-2048-u2-pvae > $OUT/f2k-u2v.log 2>&1; echo "2048 U2 + VAE rc=$? at ${SECONDS}s"
  [ $SECONDS -lt 380 ] && { timeout 100 $TR --nproc-per-node 1 bench/group.py $F --runs 2 --save /tmp/flux1.npy --out $R \
    --label flux-1gpu-compiled > $OUT/f1k-1.log 2>&1; echo "1024 1 GPU rc=$? at ${SECONDS}s"; }
  [ $SECONDS -lt 440 ] && { timeout $((540 - SECONDS)) $TR --nproc-per-node 2 bench/group.py $F --ulysses-degree 2 --runs 3 \
    --cudagraphs --compare /tmp/flux1.npy --out $R --label flux-u2-cudagraphs > $OUT/f1k-u2g.log 2>&1; \
    echo "1024 Ulysses 2, CUDA graphs rc=$? at ${SECONDS}s"; }
  tail -3 $OUT/*.log; tar czf /tmp/logs.tgz -C $OUT --exclude group.jsonl . 2>/dev/null && rm -f $OUT/*.log && mv /tmp/logs.tgz $OUT/
  ;;
handoff)  # issue 46 on GPUs: a single worker whose memory share (--gpu-memory 8) cannot hold SDXL without offload
  # hands its jobs to the queue's group lane, where a one-rank group (GPU 1, --group-jobs-only, eager) makes them
  export DIFFQ_CACHE=/tmp/dq-cache DIFFQ_QUEUE=handoff
  python3 -c "import os, redis; redis.Redis.from_url(os.environ['REDIS_URL']).flushdb()"
  printf 'prompt\n"too big for an 8 GiB share 0"\n"too big for an 8 GiB share 1"\n' > /tmp/big.csv
  CUDA_VISIBLE_DEVICES=1 DIFFQ_SPEEDUPS=vae-fp16 setsid timeout 330 $TR --nproc-per-node 1 -m worker.group --model sdxl-random \
    --group-jobs-only > $OUT/handoff-group.log 2>&1 &
  python3 - <<'PY'
import os, time, redis
from rq import Queue, Worker
conn = redis.Redis.from_url(os.environ["REDIS_URL"])
for _ in range(240):
    if Worker.all(connection=conn, queue=Queue("handoff:group", connection=conn)):
        break
    time.sleep(0.5)
print("group serving:", bool(Worker.all(connection=conn, queue=Queue("handoff:group", connection=conn))))
PY
  python3 -m producer enqueue /tmp/big.csv --model sdxl-random --steps 8 --width 512 --height 512 --chunk-size 1 \
    --output /tmp/handoff-out 2>&1 | tail -1
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m worker run --burst --gpu-memory 8 > $OUT/handoff-worker.log 2>&1
  echo "worker rc=$? at ${SECONDS}s"
  timeout 130 python3 -m producer wait --timeout 120 > $OUT/handoff-wait.log 2>&1; echo "wait rc=$? at ${SECONDS}s"
  python3 -m producer status | tee $OUT/handoff-status.txt
  python3 - <<'PY' >> $R
import json, os, redis
from rq.job import Job
from rq.registry import FinishedJobRegistry, FailedJobRegistry
from rq.serializers import JSONSerializer
conn = redis.Redis.from_url(os.environ["REDIS_URL"])
ids = FinishedJobRegistry("handoff:group", connection=conn).get_job_ids()
jobs = [Job.fetch(i, connection=conn, serializer=JSONSerializer) for i in ids]
print(json.dumps({"kind": "handoff", "made_by": {k.decode(): int(v) for k, v in conn.hgetall("diffq:handoff:made-by").items()},
                  "finished_in_group_lane": len(ids), "failed": sum(FailedJobRegistry(q, connection=conn).count for q in ("handoff", "handoff:group")),
                  "retries_left": [j.retries_left for j in jobs], "given_back_reason": [j.meta.get("error") for j in jobs], "worker": [j.worker_name for j in jobs]}))
PY
  grep -h "offload auto\|handed\|given back\|job " $OUT/handoff-worker.log | cut -c1-300 | tail -8
  pkill -TERM -f "worker.group" ; sleep 5
  ;;
esac
cat $R
