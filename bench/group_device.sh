# xDiT group benchmarks on a lent multi-GPU machine; source bench/device_setup.sh first.
#   bash bench/group_device.sh sdxl   # SDXL: 1 GPU vs our 2-GPU CFG parallel, batch 1 and 4
#   bash bench/group_device.sh flux   # FLUX.1 architecture: 1 and 2 GPUs (Ulysses)
#   bash bench/group_device.sh flux4c  # FLUX: 1 GPU, Ulysses 4 and 2, all compiled; Ulysses 4 through the queue
#   bash bench/group_device.sh sdxl4  # SDXL batch 4: 1 GPU vs CFG parallel (split decode), the worker's levers
#   bash bench/group_device.sh flux2048  # FLUX 2048²: 1 GPU, Ulysses 2, Ulysses 2 + parallel VAE; 1024² Ulysses 2 under CUDA graphs
#   bash bench/group_device.sh handoff   # a single worker too small for SDXL hands its jobs to a one-rank group
#   bash bench/group_device.sh graphsteps  # FLUX 1024²: 1 GPU and Ulysses 2, compiled, each without and with one CUDA graph per step; SDXL batch 1 too
#   bash bench/group_device.sh graphs2  # SDXL batch 1: 1 GPU without and with cuda-graphs, the CFG pair's defaults, bare and queued
#   bash bench/group_device.sh rowtune  # SDXL's UNet at 1 row (GPU 0) and 2 rows (GPU 1): CUDA graphs, then with GEMM autotuning
#   bash bench/group_device.sh fluxringq  # FLUX 1024² on 2 GPUs: the product's ring (diffusers', cuDNN, gather overlapped) against 1 GPU and Ulysses 2, through the queue, a rank killed
#   bash bench/group_device.sh fluxring4  # FLUX 1024² ring of 2: the ring's own attention against diffusers' ring and 1 GPU, profiled, queued
#   bash bench/group_device.sh flux4own  # FLUX 1024² on 4 GPUs: the product's ring of 4 (its own attention) against diffusers' ring and 1 GPU
#   bash bench/group_device.sh copygather  # NCCL's all-gather against the copy engines' pull, alone and beside GEMMs of a FLUX block's shape
#   bash bench/group_device.sh fluxring7  # FLUX 1024² ring of 2: the peers pulled by the copy engines (experiment) against NCCL's gather and 1 GPU
#   bash bench/group_device.sh fluxring8  # FLUX 1024² ring of 2: cuDNN handed views of tokens-first memory (experiment) against the product's copies, and 1 GPU
#   bash bench/group_device.sh fluxdecode  # FLUX ring of 2: the decoder split by rows over the ranks against each decoding all of it, 1024² and 2048²
#   bash bench/group_device.sh fluxmod  # FLUX 1024²: modulation-once on 1 GPU and in the ring of 2, each against the same levers without it; the ring as one attention (experiment)
#   bash bench/group_device.sh fluxmerge  # FLUX 1024² ring of 2: the last merge as one kernel (the product's) against the merge fused by Inductor, and 1 GPU
#   bash bench/group_device.sh fluxvae  # one GPU: FLUX 1024² without and with compile-vae, alternated; 2048² each once (time, peak memory)
#   bash bench/group_device.sh queue1  # one GPU: a one-image SDXL job through the queue against its bare call, rank 0's main thread timed by part
#   bash bench/group_device.sh rounding2  # 2 GPUs: FLUX 1024² and 2048², one GPU and the ring of 2, pixels rounded on the device against on the host, alternated
#   bash bench/group_device.sh done2q  # 2 GPUs, one call: the SDXL CFG pair at batch 1 against one GPU with its levers, and through the queue
#   bash bench/group_device.sh done2  # then done2b, done2c, done2d: 2 GPUs, back to back on one machine: the issue's "done means" (SDXL b1; FLUX 1024²/2048²; SDXL b4; data parallel)
#   bash bench/group_device.sh fluxfusering  # 2 GPUs: the FLUX ring of 2 without and with fuse-qkv, alternated, against one GPU
#   bash bench/group_device.sh fusering2  # 2 GPUs: one GPU without and with fuse-qkv, the ring with it on a cold cache and warm (twice), without it between
#   bash bench/group_device.sh fuse2048  # 2 GPUs: FLUX 2048², one GPU against the ring of 2 with its defaults (fuse-qkv among them), time and peak memory
#   bash bench/group_device.sh fluxworker  # FLUX 1024²: a single worker through the queue, auto as it was (SDXL's levers) and now (a DiT's)
#   bash bench/group_device.sh fluxgraphs  # FLUX 1024²: 1 GPU, the product's Ulysses 2 without and with its CUDA graphs (the group's default), through the queue, a rank killed mid-job
#   bash bench/group_device.sh flux4g  # FLUX 1024² on 4 GPUs: 1 GPU, Ulysses 4 and 2 as the product runs them (with and without its CUDA graphs), Ulysses 4 through the queue
#   bash bench/group_device.sh flux2048g  # FLUX 2048²: 1 GPU against Ulysses 2 as the product splits it now (diffusers, CUDA graphs), time and peak memory
#   bash bench/group_device.sh flux4r  # FLUX 1024² on 4 GPUs: the product's ring of 4 against its Ulysses 4 and one GPU
# The phases of the investigations whose answers are written down (docs/groups.md's changelog) are in git
# history (git log --diff-filter=D -- bench/ finds the scripts they ran): these are the ones the current figures came from.
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
flux4r)  # issue 46: FLUX 1024² on 4 GPUs as a ring of 4 (the product's --ring-degree 4) against Ulysses 4, one GPU
  export DIFFQ_CACHE=/tmp/dq-cache TORCHINDUCTOR_CACHE_DIR=/tmp/dq-cache/inductor
  DIFFQ_SPEEDUPS=vae-fp16,compile-blocks timeout 150 $TR --nproc-per-node 1 bench/group.py $F --runs 3 \
    --save /tmp/flux1.npy --out $R --label flux-1gpu-compiled > $OUT/flux1c.log 2>&1; echo "1 GPU rc=$? at ${SECONDS}s"
  for d in ring ulysses; do
    timeout 130 $TR --nproc-per-node 4 bench/group.py $F --$d-degree 4 --runs 3 --compare /tmp/flux1.npy \
      --out $R --label flux-${d:0:1}4-product > $OUT/flux4-$d.log 2>&1; echo "$d 4 rc=$? at ${SECONDS}s"
  done
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
rowtune)  # issue 46: a CFG rank's UNet (1 row) does not fill an H100 (22.8 ms against 35.3 at 2 rows); do
  # Inductor's GEMM templates, tuned per shape, fill it better than cuBLAS? Both row counts at once, one GPU each
  for g in 0 1; do
    CUDA_VISIBLE_DEVICES=$g timeout 530 python3 bench/unet_levers.py --out $OUT/rows$((g + 1)).jsonl --rows $((g + 1)) \
      --budget-s 520 --min-left-s 60 --variants cudagraphs-fp16,gemmtune-fp16 > $OUT/rows$((g + 1)).log 2>&1 &
  done
  wait; cat $OUT/rows1.jsonl $OUT/rows2.jsonl > $R; grep -h -i -E "error|Traceback" $OUT/rows*.log | head
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
