"""Fault injection for the failure-path tests, installed by a test wrapper around the shipped
worker (``tests/held_worker.py``, ``tests/held_group.py``); the product has no fault switch.

Only the fault is fake: the job still runs the real pipeline, and an injected out-of-memory is
the real ``torch.OutOfMemoryError`` raised where CUDA raises it (inside the UNet's forward), so
the splitting code under test cannot tell the difference. Each fault is asked for by a
``DIFFQ_FAULT_*`` variable that only these wrappers read:

- ``DIFFQ_FAULT_OOM_ABOVE=N``: the UNet raises an OOM for batches of more than N images.
- ``DIFFQ_FAULT_FAIL_ATTEMPTS=N``: a job's first N attempts raise a transient error.
- ``DIFFQ_FAULT_BLOCK_DECODE=<file>``: before each batch, the main thread sits in one C call
  (``pthread_mutex_lock`` on a mutex a helper thread holds) until ``<file>`` exists: Python runs
  no signal handler meanwhile, as in a long VAE decode, and no machine is fast enough to leave
  it early (a matrix product of fixed size took 5 s here and a fraction of a second elsewhere).
- ``DIFFQ_FAULT_HOLD_WRITER=<file>``: a job's images are held until ``<file>`` exists.
- ``DIFFQ_FAULT_GROUP_RANK=<rank>:<marker>``: that group rank raises on prompts with the marker.
- ``DIFFQ_FAULT_GROUP_HANG=<rank>:<file>``: that rank hangs in its first batch unless the file
  exists, like a CUDA wait on a dead peer.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("diffq.worker")
_HOOKED = "_diffq_oom_fault"


class InjectedFault(RuntimeError):
    """A transient failure on purpose, to test retries."""


def install_oom_fault(pipe: Any, max_images: int) -> None:
    """Make ``pipe.unet`` raise ``torch.OutOfMemoryError`` for batches above ``max_images`` images."""
    import torch

    if getattr(pipe.unet, _HOOKED, None) == max_images:
        return

    def hook(_module: Any, args: tuple[Any, ...]) -> None:
        rows = args[0].shape[0]
        images = rows // 2 if getattr(pipe, "do_classifier_free_guidance", False) else rows
        if images > max_images:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory (injected by DIFFQ_FAULT_OOM_ABOVE={max_images}: batch of {images} images)"
            )

    pipe.unet.register_forward_pre_hook(hook)
    setattr(pipe.unet, _HOOKED, max_images)


def block_in_c(release: Path) -> None:
    """Sit in ``pthread_mutex_lock`` (which never returns for a signal, EINTR included) on a
    mutex that a helper thread holds until ``release`` exists; ctypes lets go of the GIL."""
    import ctypes
    import threading

    libc = ctypes.CDLL(None, use_errno=True)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER on glibc
    held = threading.Event()

    def holder() -> None:
        libc.pthread_mutex_lock(mutex)
        held.set()
        while not release.exists():
            time.sleep(0.05)
        libc.pthread_mutex_unlock(mutex)

    threading.Thread(target=holder, name="fault-holder", daemon=True).start()
    held.wait()
    log.warning("fault: one C call starts and holds until %s exists (DIFFQ_FAULT_BLOCK_DECODE)", release)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_unlock(mutex)
    log.warning("fault: the C call returned")


def install_worker_faults() -> None:
    """Wrap the shipped worker's functions for each fault the environment asks for."""
    env = os.environ
    if env.get("DIFFQ_FAULT_FAIL_ATTEMPTS"):
        import worker.serving.task as task

        fail_attempts = int(env["DIFFQ_FAULT_FAIL_ATTEMPTS"])
        real_count = task._count_attempt

        def count_attempt(job: Any) -> int:
            attempt = real_count(job)
            if attempt <= fail_attempts:
                raise InjectedFault(
                    f"injected transient fault on attempt {attempt} (DIFFQ_FAULT_FAIL_ATTEMPTS={fail_attempts})"
                )
            return attempt

        task._count_attempt = count_attempt
    if env.get("DIFFQ_FAULT_HOLD_WRITER"):
        import worker.serving.task as task

        flag = env["DIFFQ_FAULT_HOLD_WRITER"]
        real_save = task._save

        def save(*args: Any, **kwargs: Any) -> Any:
            log.warning("fault: the writer holds its images until %s exists", flag)
            while not Path(flag).exists():
                time.sleep(0.05)
            return real_save(*args, **kwargs)

        task._save = save
    oom_above, block = env.get("DIFFQ_FAULT_OOM_ABOVE"), env.get("DIFFQ_FAULT_BLOCK_DECODE")
    if oom_above or block:
        from worker.pipelines.warm import WarmPipelines

        real_generate = WarmPipelines.generate

        def generate(self: WarmPipelines, loaded: Any, *args: Any, **kwargs: Any) -> Any:
            if oom_above:
                install_oom_fault(loaded.pipe, int(oom_above))
            if block:
                block_in_c(Path(block))
            return real_generate(self, loaded, *args, **kwargs)

        WarmPipelines.generate = generate  # type: ignore[method-assign]


def install_group_faults() -> None:
    """A group rank's faults: torchrun tells each process its rank in ``RANK``."""
    rank = os.environ.get("RANK", "0")
    failing, _, marker = os.environ.get("DIFFQ_FAULT_GROUP_RANK", "").partition(":")
    hanging, _, hang_file = os.environ.get("DIFFQ_FAULT_GROUP_HANG", "").partition(":")
    if rank not in (failing, hanging):
        return
    from worker.group.engine import RankEngine

    real_run = RankEngine._run

    def run(self: RankEngine, work: dict[str, Any], on_step: Any) -> Any:
        if rank == failing and any((marker or "fail") in p for p in work["prompts"]):
            raise InjectedFault(f"injected fault on rank {rank} (DIFFQ_FAULT_GROUP_RANK)")
        if rank == hanging and not Path(hang_file).exists():
            Path(hang_file).touch()
            log.warning("rank %s: injected hang (DIFFQ_FAULT_GROUP_HANG), like a CUDA wait on a dead peer", rank)
            time.sleep(600)
        return real_run(self, work, on_step)

    RankEngine._run = run  # type: ignore[method-assign]
