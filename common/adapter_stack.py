"""Several adapters on one job, as a cell or flag spells them: ``style.safetensors:0.8+lightning.safetensors:1``.

Each part is an adapter (a path or a preset) and, after its last ``:``, its weight (1 when the
part has none). The producer stores the stack canonically (absolute paths, weights as ``%g``,
in the order given), so the same stack written two ways is one item key; the order is kept
because merging several DoRA adapters is not commutative (each normalises the weight the one
before it left).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from common.errors import InvalidJobSpec

#: the most adapters one job stacks (each merge is a pass over its layers' weights)
MAX_STACK = 8
MAX_WEIGHT = 10.0

Stack = tuple[tuple[str, float], ...]


def parse(text: str) -> Stack:
    """``text``'s adapters and weights; :class:`InvalidJobSpec` with what is wrong."""
    parts = [part.strip() for part in text.split("+")]
    if not text.strip() or not all(parts):
        raise InvalidJobSpec(f"adapters {text!r}: give adapter:weight parts joined by '+' (a.safetensors:0.8+b:1)")
    if len(parts) > MAX_STACK:
        raise InvalidJobSpec(f"adapters {text!r}: {len(parts)} adapters; at most {MAX_STACK} stack on one job")
    stack = []
    for part in parts:
        head, _, tail = part.rpartition(":")
        try:
            name, weight = (head, float(tail)) if head else (part, 1.0)
        except ValueError:
            name, weight = part, 1.0  # a ':' in the path itself, and no weight
        if not name.strip() or name.endswith(":") or not math.isfinite(weight) or abs(weight) > MAX_WEIGHT:
            raise InvalidJobSpec(f"adapters {text!r}: {part!r} needs a name and a weight within ±{MAX_WEIGHT:g}")
        stack.append((name.strip(), weight))
    names = [name for name, _ in stack]
    if len(set(names)) != len(names):
        raise InvalidJobSpec(f"adapters {text!r}: an adapter is named twice; give each once with its weight")
    return tuple(stack)


def spell(stack: Stack) -> str:
    """The canonical text of ``stack``."""
    return "+".join(f"{name}:{weight:g}" for name, weight in stack)


def canonical(text: str, resolve: Callable[[str], str]) -> str:
    """``text`` with each adapter resolved (``resolve``: absolute and checked) and weights as ``%g``."""
    return spell(tuple((resolve(name), weight) for name, weight in parse(text)))


def check(name: str, value: object) -> None:
    """A :class:`~common.jobspec.GenParams` check: None, or a stack :func:`parse` takes."""
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidJobSpec(f"{name} must be text like a.safetensors:0.8+b.safetensors:1")
    parse(value)
