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
