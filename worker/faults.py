"""Fault injection for tests of the failure paths, switched on by settings (off by default).

Only the fault is fake: the job still runs the real pipeline, and the exception is the real
``torch.OutOfMemoryError`` raised where CUDA would raise it (inside the UNet's forward), so
the splitting code under test cannot tell the difference.
"""

from __future__ import annotations

from typing import Any

import torch

_HOOKED = "_diffq_oom_fault"


def install_oom_fault(pipe: Any, max_images: int) -> None:
    """Make ``pipe.unet`` raise ``torch.OutOfMemoryError`` for batches above ``max_images`` images."""
    if max_images < 0 or getattr(pipe.unet, _HOOKED, None) == max_images:
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


class InjectedFault(RuntimeError):
    """A transient failure on purpose (``DIFFQ_FAULT_FAIL_ATTEMPTS``), to test retries."""


def fail_early_attempts(attempt: int, fail_attempts: int) -> None:
    if attempt <= fail_attempts:
        raise InjectedFault(
            f"injected transient fault on attempt {attempt} (DIFFQ_FAULT_FAIL_ATTEMPTS={fail_attempts})"
        )


def block_in_c(size: int) -> None:
    """Hold the main thread in one long C call (a ``size``-square float64 matrix product), as a
    VAE decode at 4096² or a model load does: Python runs no signal handler until it returns."""
    if size <= 0:
        return
    import logging

    log = logging.getLogger("diffq.worker")
    a = torch.ones(size, size, dtype=torch.float64)
    log.warning("fault: a %d² matrix product in one C call starts (DIFFQ_FAULT_BLOCK_DECODE)", size)
    torch.mm(a, a)
    log.warning("fault: the C call returned")


def hold_writer(flag_file: str) -> None:
    """Hold a job's images until ``flag_file`` exists, as a stalled disk would; the worker meanwhile
    takes the next job (overlap), or is killed by a test with images in the writer."""
    if not flag_file:
        return
    import logging
    import time
    from pathlib import Path

    logging.getLogger("diffq.worker").warning("fault: the writer holds its images until %s exists", flag_file)
    while not Path(flag_file).exists():
        time.sleep(0.05)
