"""A small progress line on stderr: count, rate and ETA.

On a terminal it redraws one line; in a log (not a TTY) it prints a line every few seconds,
so `producer wait` in CI or under compose still shows it is alive.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    def __init__(self, label: str, total: int | None, unit: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream or sys.stderr
        self.done = 0
        self.started = time.monotonic()
        self._last_draw = self.started  # short operations print only their closing line
        self._tty = self.stream.isatty()
        self._interval = 0.2 if self._tty else 5.0

    def update(self, done: int, total: int | None = None, extra: str = "") -> None:
        self.done = done
        if total is not None:
            self.total = total
        now = time.monotonic()
        if now - self._last_draw >= self._interval:
            self._last_draw = now
            self._draw(extra)

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def close(self, extra: str = "") -> None:
        self._draw(extra)
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()

    def line(self, extra: str = "") -> str:
        elapsed = time.monotonic() - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.total:
            pct = 100.0 * self.done / self.total
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            eta_text = format_duration(eta) if eta != float("inf") else "?"
            text = (
                f"{self.label}: {self.done}/{self.total} {self.unit} ({pct:5.1f}%) "
                f"{rate:.1f} {self.unit}/s, ETA {eta_text}"
            )
        else:
            text = f"{self.label}: {self.done} {self.unit}, {rate:.1f} {self.unit}/s"
        return f"{text} {extra}".rstrip()

    def _draw(self, extra: str) -> None:
        text = self.line(extra)
        if self._tty:
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
