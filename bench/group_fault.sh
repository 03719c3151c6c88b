# A rank killed mid-job on GPUs (NCCL), the group restarted by torchrun; source bench/device_setup.sh first.
#   bash bench/group_fault.sh     -> $OUT/fault.log, $OUT/fault.txt
#   FAULT_MODEL=flux-random FAULT_DEGREES="--ulysses-degree 2" FAULT_ENQUEUE="--steps 28 --guidance 3.5" bash bench/group_fault.sh
set -u
M=${FAULT_MODEL:-sdxl-random}; D=${FAULT_DEGREES:---cfg-parallel}; E=${FAULT_ENQUEUE:-}
export DIFFQ_QUEUE=gfault
W=/tmp/gfault; rm -rf $W; mkdir -p $W
python3 -c "import redis; redis.Redis.from_url('$REDIS_URL').flushdb()"
printf 'prompt\n' > $W/p.csv; for i in 0 1 2 3 4 5; do echo "\"fault prompt $i, a red fox in snow\"" >> $W/p.csv; done
python3 -m producer enqueue $W/p.csv --model $M $E --chunk-size 1 --output $W/out > $OUT/fault.txt 2>&1
python3 -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 1 -m worker.group \
  --model $M $D --burst --timeout 60 > $OUT/fault.log 2>&1 &
TR=$!
# the third job has started: its prompt logged (SDXL), or the second job's line written (FLUX logs no prompt)
for _ in $(seq 600); do
  grep -q "fault prompt 2" $OUT/fault.log && break
  [ "$(grep -c 'image(s) in' $OUT/fault.log)" -ge 2 ] && break
  sleep 0.2
done
sleep 0.7
PID1=$(sed -n "s/.*rank 1 (pid \([0-9]*\)).*/\1/p" $OUT/fault.log | head -1)
echo "killing rank 1 (pid $PID1) at $(date +%T.%N)" >> $OUT/fault.txt
kill -9 $PID1
timeout 300 tail --pid=$TR -f /dev/null
wait $TR; echo "torchrun exit $?" >> $OUT/fault.txt
echo "pngs: $(find $W/out -name '*.png' | wc -l), metadata lines: $(wc -l < $W/out/metadata.jsonl)" >> $OUT/fault.txt
python3 -m producer status >> $OUT/fault.txt 2>&1
grep -n "re-queued\|left the group\|lost\|Restarting\|restart\|loading model sdxl\|group ready\|Job OK\|abandoned\|requeue" $OUT/fault.log | grep -v "^\S*\[rank" | head -40 >> $OUT/fault.txt
cat $OUT/fault.txt
