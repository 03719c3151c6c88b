"""What a worker shows while it downloads and loads a model: a first SDXL run fetches ~7 GB,
and a log that says ``loading model …`` and then nothing for minutes looks hung.

diffusers downloads through ``huggingface_hub.snapshot_download``, whose byte counter is a
tqdm bar created from the module's ``hf_tqdm`` name (``from_pretrained`` passes no ``tqdm_class``
of its own). :func:`download_progress` puts a reporting bar there for the duration of one load:
every 10 % it calls ``report("downloading model: 2.6 of 6.9 GiB (37%)")``, which the worker
writes to its log and to the running job's ``meta`` (``producer status``, rq-dashboard).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tqdm.auto import tqdm


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


class _Reporting(tqdm):
    """A silent tqdm (its text goes nowhere) that reports its bytes every 10 %."""

    report: Callable[[str], None] = staticmethod(lambda text: None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["file"] = io.StringIO()
        kwargs.pop("name", None)
        super().__init__(*args, **kwargs)
        self._said = -1

    def update(self, n: float | None = 1) -> bool | None:
        out = super().update(n)
        if self.total and self.unit == "B":
            percent = min(100, int(100 * self.n / self.total))
            if percent // 10 > self._said // 10:
                self._said = percent
                type(self).report(f"downloading model: {_size(self.n)} of {_size(self.total)} ({percent}%)")
        return out


@contextmanager
def download_progress(report: Callable[[str], None]) -> Iterator[None]:
    """While the block runs, hub downloads report their progress to ``report``."""
    import huggingface_hub._snapshot_download as snapshot

    previous = getattr(snapshot, "hf_tqdm", None)
    if previous is None:  # another huggingface_hub: downloads still work, silently
        yield
        return
    snapshot.hf_tqdm = type("ReportingTqdm", (_Reporting,), {"report": staticmethod(report)})
    try:
        yield
    finally:
        snapshot.hf_tqdm = previous
