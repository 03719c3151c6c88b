# Source this first in every device call: installs the carried wheels, starts the carried Redis.
#   carry: .whl (diffusers, rq, redis, croniter, importlib_metadata, lazy_importer; for groups
#          xfuser, distvae, yunchang, einops, beautifulsoup4, soupsieve)
#          .redis (Debian's redis-tools + libjemalloc2, liblzf1, libatomic1, unpacked with dpkg -x)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  $(ls .whl/*.whl | grep -v /torchao-) || return 1
# torchao only on the FP8 phases' path (PYTHONPATH=/tmp/site-fp8:...): the project does not depend on it, and
# diffusers imports it at start-up whenever it is installed
ls .whl/torchao-*.whl >/dev/null 2>&1 && { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site-fp8 .whl/torchao-*.whl || return 1; }
# bytecode now, as pip does by default (and the Dockerfile's pip): else every worker compiles diffusers' sources
python3 -m compileall -q -j 0 /tmp/site /tmp/site-fp8 >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# The image ships torch (and most of its site-packages) without bytecode and runs Python with
# PYTHONDONTWRITEBYTECODE=1, so every process compiled torch's sources again: 20.3 s of imports
# for a worker against 9.4-11.5 s with bytecode (2026-11-23). A pip-installed image (the
# Dockerfile) has the bytecode; give these machines the same, once per call, in a prefix folder.
SP=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
PYTHONPYCACHEPREFIX=/tmp/pyc python3 -m compileall -q -j 12 "$SP" /tmp/site "$PWD/common" "$PWD/worker" "$PWD/producer" >/dev/null 2>&1
export PYTHONPYCACHEPREFIX=/tmp/pyc
mkdir -p /tmp/redis-bin
ln -sf "$PWD/.redis/usr/bin/redis-check-rdb" /tmp/redis-bin/redis-server   # one binary; argv[0] picks the mode
LD_LIBRARY_PATH="$PWD/.redis/usr/lib/x86_64-linux-gnu" /tmp/redis-bin/redis-server \
  --port 6390 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes --dir /tmp --logfile /tmp/redis.log || return 1
export REDIS_URL=redis://127.0.0.1:6390/0
for _ in $(seq 50); do python3 -c "import redis; redis.Redis.from_url('$REDIS_URL').ping()" 2>/dev/null && break; sleep 0.2; done
python3 - <<'PY'
import torch, diffusers, transformers, rq, redis
print(f"torch {torch.__version__} cuda {torch.version.cuda} diffusers {diffusers.__version__} transformers {transformers.__version__} rq {rq.__version__}")
print("gpus:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
print("redis-server", redis.Redis.from_url("redis://127.0.0.1:6390/0").info()["redis_version"])
PY
