#!/bin/bash
# The throughput issue's measurements on one GPU, one phase list per call (each phase logs
# under $OUT and appends JSON lines to $OUT/throughput.jsonl). Source bench/device_setup.sh
# first (carry .whl with torchao, and .redis).
#   bash bench/throughput_device.sh base defaults match:defaults adapters   # call 1
#   bash bench/throughput_device.sh start:cold start:warm fp8 match:fp8     # call 2
#   IMAGES=32 bash bench/throughput_device.sh defaults e2e:vaec:vae-fp16,compile-blocks,compile-vae fp8row
#   BASE_BUDGET=75 IMAGES=40 bash bench/throughput_device.sh base defaults start:warm serial  # overlap
set -u
OUT=${OUT:-/tmp/out}
R=$OUT/throughput.jsonl
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee -a $OUT/gpu.txt
for phase in "$@"; do
  echo "== $phase $(date +%T)" | tee -a $OUT/phases.txt
  case $phase in
    startup)  # where a worker's start goes: interpreter + torch + CUDA, then the worker's imports
      python3 -c "import sys, os; print('dont_write_bytecode', sys.flags.dont_write_bytecode, os.cpu_count(), 'cpus')" \
        | tee -a $OUT/startup.txt
      TIMEFORMAT="%R s"
      for i in 1 2; do
        { echo -n "torch + CUDA context: "; time python3 -c "import torch; torch.zeros(1, device='cuda')"; } 2>&1 | tee -a $OUT/startup.txt
        { echo -n "worker imports: "; time python3 -c "import worker.pipelines.warm, worker.serving.rqworker"; } 2>&1 \
          | tee -a $OUT/startup.txt
      done
      { echo -n "worker imports, torchao on the path: "; time PYTHONPATH=/tmp/site-fp8:$PYTHONPATH \
          python3 -W ignore -c "import worker.pipelines.warm, worker.serving.rqworker"; } 2>&1 | tee -a $OUT/startup.txt
      python3 -X importtime -c "import worker.pipelines.warm, worker.serving.rqworker" 2> $OUT/importtime.txt
      sort -t'|' -k2 -n -r $OUT/importtime.txt | head -25 >> $OUT/startup.txt ;;
    pyc)  # is a worker's slow start the image's missing bytecode? imports before and after compiling it
      SP=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
      { echo "site-packages $SP; PYTHON* env: $(env | grep ^PYTHON | tr '\n' ' ')"
        echo "torch: $(find $SP/torch -name '*.py' | wc -l) .py, $(find $SP/torch -name '*.pyc' | wc -l) .pyc"
        echo "transformers: $(find $SP/transformers -name '*.py' | wc -l) .py, $(find $SP/transformers -name '*.pyc' | wc -l) .pyc"
        python3 -c "import time; t = time.perf_counter(); sum(i * i for i in range(10**7)); print(f'pure-Python loop 1e7: {time.perf_counter() - t:.2f} s')"
      } 2>&1 | tee -a $OUT/pyc.txt
      TIMEFORMAT="%R s"
      { echo -n "worker imports, the image as it is: "; time python3 -c "import worker.pipelines.warm, worker.serving.rqworker"; } 2>&1 | tee -a $OUT/pyc.txt
      { echo -n "bytecode for site-packages into /tmp/pyc: "; time PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m compileall -q -j 12 $SP /tmp/site $PWD/common $PWD/worker >/dev/null 2>&1; } 2>&1 | tee -a $OUT/pyc.txt
      for i in 1 2; do { echo -n "worker imports, bytecode in /tmp/pyc: "; time PYTHONPYCACHEPREFIX=/tmp/pyc python3 -c "import worker.pipelines.warm, worker.serving.rqworker"; } 2>&1 | tee -a $OUT/pyc.txt; done
      PYTHONPYCACHEPREFIX=/tmp/pyc python3 -X importtime -c "import worker.pipelines.warm, worker.serving.rqworker" 2> $OUT/importtime-pyc.txt
      sort -t'|' -k2 -n -r $OUT/importtime-pyc.txt | head -12 >> $OUT/pyc.txt ;;
    regions)  # a compiled UNet step by region; the whole UNet and the VAE decoder compiled (bench/regions.py)
      timeout ${REGIONS_S:-400} python3 bench/regions.py --out $R --budget-s ${REGIONS_S:-400} 2>&1 | grep -v Warning > $OUT/regions.log ;;
    levers)  # the whole UNet, one compile lever at a time: build time, call time, watts, SM clock (bench/unet_levers.py)
      timeout ${LEVERS_S:-460} python3 bench/unet_levers.py --out $R --budget-s ${LEVERS_S:-460} ${LEVERS:+--variants $LEVERS} 2>&1 \
        | grep -v Warning > $OUT/levers.log ;;
    base)  # matmul ceiling, FLOPs, plain pipe() per image, run_batch at batch 8, + vae-fp16
      (CUDA_VISIBLE_DEVICES="" nice python3 bench/make_adapters.py /tmp/adapters > $OUT/adapters.log 2>&1 &)
      timeout 150 python3 bench/pipeline.py --out $R --batches 8 --levers vae-fp16 --repeats 1 --budget-s ${BASE_BUDGET:-120} \
        > $OUT/base.log 2>&1 ;;
    defaults)  # the worker's defaults through the queue, on a cold compile cache
      timeout 240 python3 bench/e2e_queue.py --out $R --tag defaults --images-per-gpu ${IMAGES:-48} --timeout 230 \
        > $OUT/defaults.log 2>&1 ;;
    match:*)  # a run's images against the plain eager fp16 pipeline, same prompts and seeds
      tag=${phase#match:}
      [ $SECONDS -lt ${MATCH_BEFORE_S:-9999} ] && timeout 90 python3 bench/match_eager.py /tmp/diffq-bench/bench1$tag --out $R --n 8 --tag $tag --dtype ${MATCH_DTYPE:-float16} \
        > $OUT/match-$tag.log 2>&1 ;;
    adapters)  # none, LoRA, DoRA in turn, one chunk each; a fresh worker on the now warm cache
      for _ in $(seq 60); do [ -f /tmp/adapters/dora/pytorch_lora_weights.safetensors ] && break; sleep 2; done
      timeout 240 python3 bench/e2e_queue.py --out $R --tag adapters --images-per-gpu 72 --timeout 230 \
        --adapters none,/tmp/adapters/lora,/tmp/adapters/dora > $OUT/adapters-e2e.log 2>&1 ;;
    start:*)  # the defaults, a fresh worker: first image on whatever compile cache the host has now
      tag=${phase#start:}
      timeout 240 python3 bench/e2e_queue.py --out $R --tag $tag --images-per-gpu ${START_IMAGES:-24} --timeout 230 \
        > $OUT/start-$tag.log 2>&1 ;;
    fleet)  # compile once per fleet (--compile-cache redis): host A compiles into the queue's Redis with empty
      # folders; host B, empty folders of its own, loads from Redis; then B again, its own folder now warm.
      # The cache gets a Redis of its own (e2e_queue.py flushes the queue's before each run).
      LD_LIBRARY_PATH="$PWD/.redis/usr/lib/x86_64-linux-gnu" /tmp/redis-bin/redis-server --port 6391 --bind 127.0.0.1 \
        --save "" --appendonly no --daemonize yes --dir /tmp --logfile /tmp/redis-cache.log
      grep -c TORCHINDUCTOR_REDIS_URL $(python3 -c "import torch._inductor.remote_cache as m; print(m.__file__)") \
        | sed 's/^/TORCHINDUCTOR_REDIS_URL mentions in remote_cache.py: /' | tee -a $OUT/fleet.txt
      for h in A B B; do
        tag=fleet$h$( [ -d /tmp/host$h ] && echo warm )
        DIFFQ_COMPILE_CACHE=redis://127.0.0.1:6391/0 TORCHINDUCTOR_CACHE_DIR=/tmp/host$h/inductor timeout 240 \
          python3 bench/e2e_queue.py --out $R --tag $tag --images-per-gpu ${START_IMAGES:-16} --timeout 230 > $OUT/$tag.log 2>&1
        python3 -c "import redis; r = redis.Redis(port=6391); k = list(r.scan_iter('pt2:*')); \
print('$tag: redis pt2 keys', len(k), 'bytes', sum(r.strlen(x) for x in k))" | tee -a $OUT/fleet.txt
      done ;;
    apis)  # which of torch's ahead-of-time pieces this torch has (a warm host's start without Dynamo's trace)
      python3 - <<'PY' 2>&1 | tee -a $OUT/apis.txt
import inspect, torch, torch._dynamo, torch._inductor, torch.compiler
from torch._dynamo.eval_frame import OptimizedModule
print("torch", torch.__version__)
for owner, name in [(torch._dynamo, "aot_compile"), (torch.compiler, "load_compiled_function"),
                    (torch.compiler, "save_cache_artifacts"), (torch._inductor, "aoti_compile_and_package"),
                    (torch._inductor, "aoti_load_package"), (OptimizedModule, "_aot_compile"),
                    (OptimizedModule, "_save_aot_compiled_module"), (OptimizedModule, "_load_aot_compiled_module")]:
    f = getattr(owner, name, None)
    try:
        sig = str(inspect.signature(f)) if f else "-"
    except (TypeError, ValueError):
        sig = "?"
    print(f"{owner.__name__}.{name}: {'yes' if f else 'no'} {sig}")
PY
      ;;
    precompile)  # compiled graphs kept as files (worker/pipelines/precompiled.py): host A compiles with
      # empty folders and a shared cache Redis; host B, empty folders of its own, loads A's files from
      # Redis; B again, its folder warm; then the lazy torch.compile of before (DIFFQ_PRECOMPILE=0) on A's
      # warm folder: the baseline a warm host had
      LD_LIBRARY_PATH="$PWD/.redis/usr/lib/x86_64-linux-gnu" /tmp/redis-bin/redis-server --port 6391 --bind 127.0.0.1 \
        --save "" --appendonly no --daemonize yes --dir /tmp --logfile /tmp/redis-cache.log
      for run in ${PRE_RUNS:-A:preA:1 B:preB:1 B:preBwarm:1 A:lazyAwarm:0}; do  # host:tag:DIFFQ_PRECOMPILE
        IFS=: read -r h tag on <<< "$run"
        DIFFQ_PRECOMPILE=$on DIFFQ_COMPILE_CACHE=redis://127.0.0.1:6391/0 TORCHINDUCTOR_CACHE_DIR=/tmp/host$h/inductor \
          timeout ${PRE_S:-200} python3 bench/e2e_queue.py --out $R --tag $tag --images-per-gpu ${START_IMAGES:-24} \
          --timeout $(( ${PRE_S:-200} - 10 )) > $OUT/$tag.log 2>&1
        grep -h "compiled graphs\|compiled for" $OUT/worker-bench1$tag.log | cut -c1-300 | tee -a $OUT/precompile.txt
        python3 -c "import redis; r = redis.Redis(port=6391); k = list(r.scan_iter('diffq:compiled:*')); \
print('$tag: redis files', len(k), 'bytes', sum(r.strlen(x) for x in k))" | tee -a $OUT/precompile.txt
        du -sh /tmp/host$h/inductor/precompiled 2>/dev/null | tee -a $OUT/precompile.txt
      done ;;
    serial)  # the defaults with overlap off (DIFFQ_OVERLAP_SAVE=0), a fresh worker on the warm cache
      DIFFQ_OVERLAP_SAVE=0 timeout 240 python3 bench/e2e_queue.py --out $R --tag serial --images-per-gpu 32 \
        --timeout 230 > $OUT/serial.log 2>&1 ;;
    fp8row)  # FP8 with per-row scales: a bf16 UNet (torchao takes per-row scales from bf16 weights only)
      [ $SECONDS -lt ${FP8_BEFORE_S:-330} ] && PYTHONPATH=/tmp/site-fp8:$PYTHONPATH DIFFQ_DTYPE=bfloat16 timeout 340 python3 bench/e2e_queue.py --out $R \
        --tag fp8row --images-per-gpu 24 --timeout 330 --speedups vae-fp16,compile-blocks,fp8 > $OUT/fp8row.log 2>&1 ;;
    dtype:*)  # the dtype of the phases after this one (DIFFQ_DTYPE)
      export DIFFQ_DTYPE=${phase#dtype:} ;;
    bf16)  # fp8row's levers without fp8, bf16: the baseline the FP8 lever is measured against
      DIFFQ_DTYPE=bfloat16 timeout 240 python3 bench/e2e_queue.py --out $R --tag bf16 --images-per-gpu 24 --timeout 230 \
        --speedups vae-fp16,compile-blocks > $OUT/bf16.log 2>&1 ;;
    e2e:*)  # e2e:<tag>:<speedups> through the queue, 32 images (skipped past E2E_BEFORE_S into the call)
      spec=${phase#e2e:}; tag=${spec%%:*}; levers=${spec#*:}
      [ $SECONDS -lt ${E2E_BEFORE_S:-9999} ] && timeout 300 python3 bench/e2e_queue.py --out $R --tag $tag --images-per-gpu 32 --timeout 290 \
        --speedups $levers > $OUT/e2e-$tag.log 2>&1 ;;
    fp8)  # FP8 linears (opt-in) with vae-fp16 and compile-blocks, as measured before this issue
      PYTHONPATH=/tmp/site-fp8:$PYTHONPATH timeout 420 python3 bench/e2e_queue.py --out $R --tag fp8 --images-per-gpu 32 --timeout 410 \
        --speedups vae-fp16,compile-blocks,fp8 > $OUT/fp8.log 2>&1
      grep -v "INFO Worker\|Successfully\|SyntaxWarning\|Configuration class" $OUT/worker-bench1fp8.log | cut -c1-400 | tail -25 ;;
  esac
done
tar czf $OUT/logs.tgz -C $OUT --exclude logs.tgz --exclude throughput.jsonl . 2>/dev/null
cat $R
