"""One-pass normalizations: the compiler's persistent reductions widened to SDXL's LayerNorms.

Inductor writes a row reduction (a LayerNorm's mean and variance) either *persistent*, the whole
row in registers, read once, or *looped*, read in blocks once for the statistics and again to
normalize. It takes the persistent form up to 1024 elements a row (``InductorChoices``), and
SDXL's 60 transformer blocks at the 1280-channel level normalize rows of 1280: each of their
three LayerNorms (with the residual add before it and the next linear's FP8 cast after it, fused
in) reads its row twice. :func:`widen` raises that limit for inner reductions (contiguous
rows), here to 2048; the threshold is a heuristic of the compiler, not an API, so the change is
made where the compiler asks it, and a torch without that hook gets one line and the compiler's
own choice.

The compile caches must not hand a graph compiled one way to a process that wants the other:
:func:`widen` adds its tag to ``torch.compiler.config.cache_key_tag``, which Inductor's FX-graph
and AOTAutograd cache keys include, and the worker's precompiled files are keyed by the levers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("diffq.worker")

#: rows up to this many elements are reduced in one pass (SDXL's widest LayerNorm is 1280)
PERSISTENT_LIMIT = 2048

_original: Callable[..., bool] | None = None
_tag = ""


def widen(limit: int = PERSISTENT_LIMIT) -> bool:
    """Make inner reductions of up to ``limit`` elements persistent in every later compile of this
    process; True if the compiler took it. Calling it again changes the limit."""
    global _original, _tag
    try:
        from torch._inductor import config as inductor_config
        from torch._inductor.choices import InductorChoices
        from torch._inductor.runtime.hints import ReductionHint
        from torch._inductor.virtualized import V
    except ImportError as exc:
        log.warning("speedups: persistent-norms needs torch's Inductor hooks (%s); the compiler chooses", exc)
        return False
    if not hasattr(InductorChoices, "should_use_persistent_reduction"):
        log.warning("speedups: this torch has no persistent-reduction choice to widen; the compiler chooses")
        return False
    if _original is None:
        _original = InductorChoices.should_use_persistent_reduction
    original = _original

    def wider(features: Any, cooperative_reduction: bool) -> bool:
        if original(features, cooperative_reduction):
            return True
        if not inductor_config.triton.persistent_reductions or cooperative_reduction:
            return False
        if features.get_reduction_hint() != ReductionHint.INNER:
            return False
        return bool(V.graph.sizevars.statically_known_leq(features.reduction_numel, limit))

    InductorChoices.should_use_persistent_reduction = staticmethod(wider)  # type: ignore[method-assign]
    _set_tag(f"diffq-persistent-{limit}")
    return True


def restore() -> None:
    """The compiler's own choice again (for benchmarks that compare both in one process)."""
    global _original
    if _original is None:
        return
    from torch._inductor.choices import InductorChoices

    InductorChoices.should_use_persistent_reduction = staticmethod(_original)  # type: ignore[method-assign]
    _original = None
    _set_tag("")


def _set_tag(tag: str) -> None:
    """Our part of the compile caches' key tag, beside whatever the user's own is."""
    global _tag
    import torch.compiler.config as compiler_config

    parts = [p for p in compiler_config.cache_key_tag.split(",") if p and p != _tag]
    if tag:
        parts.append(tag)
    compiler_config.cache_key_tag = ",".join(parts)
    _tag = tag
