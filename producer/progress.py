"""A small progress line on stderr: count, rate and ETA.

On a terminal it redraws one line; in a log (not a TTY) it prints a line when the count or
what it says has moved, at most every few seconds, and once a minute while it has not, so `producer wait` in CI
or under compose shows it is alive without a line every 5 s of a wait (66 lines in `make demo`).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_duration(seconds: float) -> str:
    """``45s``, ``21m16s``, ``3h02m``, ``2d04h``: a length of time, never mistaken for a clock time."""
    seconds = int(max(0, round(seconds)))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


#: off a terminal, the longest silence while nothing moves
QUIET_S = 60.0


class Progress:
    def __init__(
        self, label: str, total: int | None, unit: str, stream: TextIO | None = None, suffix: str = ""
    ) -> None:
        self.label = label
        self.suffix = suffix  # after the count: "img written"
        self.total = total
        self.unit = unit
        self.stream = stream or sys.stderr
        self.done: float = 0
        self.started = time.monotonic()
        self._last_draw = self.started  # short operations print only their closing line
        self._tty = self.stream.isatty()
        self._interval = 0.2 if self._tty else 5.0
        self._drawn: tuple[float, str] | None = None  # the count and words the last line showed
        self._rate: float | None = None
        self._eta: float | None = None
        self._fraction: float | None = None

    def update(
        self,
        done: float,
        total: int | None = None,
        extra: str = "",
        *,
        rate: float | None = None,
        eta: float | None = None,
        fraction: float | None = None,
    ) -> None:
        """``rate`` and ``eta`` when the caller knows better than "done since I started" (a
        campaign that was half done when ``producer wait`` started). ``fraction``: how far the
        work is, when that is more than ``done`` says (running jobs' steps): the count shown
        stays ``done``, the only number that means "this many exist"."""
        self.done = done
        if total is not None:
            self.total = total
        self._rate, self._eta, self._fraction = rate, eta, fraction
        now = time.monotonic()
        since = now - self._last_draw
        still = not self._tty and (done, extra) == self._drawn and since < QUIET_S
        if since >= self._interval and not still:
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
        rate = self._rate if self._rate is not None else (self.done / elapsed if elapsed > 0 else 0.0)
        digits = 2 if rate < 10 else 1
        if self.total:
            pct = 100.0 * (min(self.done, self.total) / self.total if self._fraction is None else self._fraction)
            eta = self._eta
            if eta is None and rate > 0:
                eta = (self.total - self.done) / rate
            eta_text = format_duration(eta) if eta is not None else "?"
            text = (
                f"{self.label}: {self.done:.0f}/{self.total} {self.unit}{self.suffix} ({pct:5.1f}%) "
                f"{rate:.{digits}f} {self.unit}/s, ETA {eta_text}"
            )
        else:
            text = f"{self.label}: {self.done:.0f} {self.unit}{self.suffix}, {rate:.{digits}f} {self.unit}/s"
        return f"{text} {extra}".rstrip()

    def _draw(self, extra: str) -> None:
        self._drawn = (self.done, extra)
        text = self.line(extra)
        if self._tty:
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
