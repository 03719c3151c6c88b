"""Preference data from scored images: each prompt's images filtered (``--where``), the best K
kept (``--top-k``) and ranked pairs made of them (``--pairs``), by one named score (``--by``).

A pair is two images of one prompt whose scores differ by at least ``--margin``; equal scores
are a tie and give no pair. The pair's images are in file-name order, so a pair is the same in
every export; ``label_0`` is 1 when the first image is the preferred one (Pick-a-Pic's layout:
a caption, two images, their labels, their scores and every parameter of each). Everything is a
function of the metadata alone: the same output gives the same pairs.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError

OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq,
}  # fmt: skip
WHERE = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*(>=|<=|==|>|<)\s*(-?[\d.]+(?:e-?\d+)?)\s*$")
#: columns a ``--where`` may name besides the scores
NUMERIC = ("steps", "guidance", "seed", "width", "height", "index")


@dataclass(frozen=True)
class Where:
    name: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Where:
        found = WHERE.match(text)
        if not found:
            raise ConfigError(f"--where {text!r}: write a score or column, an operator and a number: 'aesthetic > 5.5'")
        return cls(found[1], found[2], float(found[3]))

    def holds(self, record: dict[str, Any]) -> bool:
        value = value_of(record, self.name)
        return value is not None and OPERATORS[self.op](value, self.value)

    def __str__(self) -> str:
        return f"{self.name} {self.op} {self.value:g}"


def value_of(record: dict[str, Any], name: str) -> float | None:
    """A record's score ``name`` (its ``scores``), else its numeric column ``name``; None when absent."""
    scores = record.get("scores") or {}
    if name in scores:
        return float(scores[name])
    if name in NUMERIC and isinstance(record.get(name), int | float):
        return float(record[name])
    return None


def kept(group: list[dict[str, Any]], by: str | None, where: Where | None, top_k: int | None) -> list[dict[str, Any]]:
    """A prompt's images that pass ``where``, and of them the ``top_k`` best by ``by`` (ties by file name)."""
    chosen = [r for r in group if where is None or where.holds(r)]
    if top_k is not None and by is not None:
        scored = [r for r in chosen if value_of(r, by) is not None]
        scored.sort(key=lambda r: (-(value_of(r, by) or 0.0), r["file_name"]))
        chosen = sorted(scored[:top_k], key=lambda r: r["file_name"])
    return chosen


def pairs(group: list[dict[str, Any]], by: str, margin: float) -> Iterator[list[dict[str, Any]]]:
    """Each pair of ``group``'s images scored by ``by`` whose scores differ by ``margin`` or more
    (and are not equal), in file-name order, each record with its ``_label`` and ``_score``."""
    scored = sorted((r for r in group if value_of(r, by) is not None), key=lambda r: r["file_name"])
    for i, first in enumerate(scored):
        for second in scored[i + 1 :]:
            a, b = value_of(first, by) or 0.0, value_of(second, by) or 0.0
            if a == b or abs(a - b) < margin:
                continue
            yield [first | {"_label": float(a > b), "_score": a}, second | {"_label": float(b > a), "_score": b}]
