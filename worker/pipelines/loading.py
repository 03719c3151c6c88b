"""What a worker shows while it downloads and loads a model: a first SDXL run fetches ~7 GB,
and a log that says ``loading model …`` and then nothing for minutes looks hung.

diffusers downloads through ``huggingface_hub.snapshot_download``, whose byte counter is a
tqdm bar created from the module's ``hf_tqdm`` name (``from_pretrained`` passes no ``tqdm_class``
of its own). :func:`download_progress` puts a reporting bar there for the duration of one load:
every 10 % it calls ``report("downloading model: 2.6 of 6.9 GiB (37%)")``, which the worker
writes to its log and to the running job's ``meta`` (``producer status``, rq-dashboard). And
when a load fails, :func:`load_failure` says why in one line a user can act on. A single-file
checkpoint loads through :func:`from_single_file`.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from common import checkpoints
from common.errors import ModelLoadError
from common.presets import MODEL_PRESETS


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


def load_failure(exc: BaseException) -> str:
    """One line a user can act on, for a failed ``from_pretrained``. diffusers' own message is
    several hundred characters long and points at "the stacktrace above", which a user reading
    ``producer status`` does not have (the worker logs it once)."""
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " ".join(str(e) for e in chain)
    if any(isinstance(e, GatedRepoError) for e in chain):
        return "the repository is gated: accept its licence on the Hub and give the workers HF_TOKEN"
    if any(isinstance(e, RepositoryNotFoundError) for e in chain):
        return "no such repository on the Hugging Face Hub, or a private one: check the id, or give workers HF_TOKEN"
    if any(isinstance(e, LocalEntryNotFoundError | ConnectionError) for e in chain) or "not fully cached" in text:
        presets = ", ".join(MODEL_PRESETS)
        return (
            "not in this worker's cache and not downloadable from here (no network, HF_HUB_OFFLINE, or no such "
            f"repository): check the id and the worker's network, or use a local folder or a preset ({presets})"
        )
    return first_line(exc)[:300]


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0]}" if text else exc.__class__.__name__


def from_single_file(path: Path, **kwargs: Any) -> Any:
    """The pipeline of a single-file checkpoint: the class its keys name
    (:func:`common.checkpoints.checkpoint_pipeline`, the producer's test too), loaded with
    diffusers' ``from_single_file``, its configs from the folder beside it where that folder has
    a ``model_index.json``, else the ones diffusers fetches for the base model it recognises."""
    import diffusers

    try:
        name = checkpoints.runnable_pipeline(path)
    except checkpoints.Unrunnable as exc:
        raise ModelLoadError(f"model {str(path)!r}{exc}") from None
    cls = getattr(diffusers, name)
    config = checkpoints.config_folder(path)
    return cls.from_single_file(str(path), config=str(config) if config else None, **kwargs)
