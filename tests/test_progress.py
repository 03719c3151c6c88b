"""The progress line off a terminal: a line when the count moves (at most every 5 s), one a
minute while it does not; on a terminal, a redraw every 0.2 s."""

from __future__ import annotations

import io

from producer import progress
from producer.progress import Progress


def test_a_log_gets_a_line_when_the_count_moves_and_one_a_minute_while_it_does_not(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    log = io.StringIO()
    bar = Progress("queue q", 100, "img", stream=log)
    counts = [0] * 24 + [5] * 24 + [9]  # a wait polled every 5 s: 2 min still, 2 min at 5, then 9
    for done in counts:
        clock[0] += 5.0
        bar.update(done)
    lines = log.getvalue().splitlines()
    assert [line.split(": ", 1)[1].split("/", 1)[0] for line in lines] == ["0", "0", "5", "5", "9"]
    assert len(lines) == 5  # was 49, one per poll

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    live = Progress("queue q", 100, "img", stream=screen)
    for _ in range(3):
        clock[0] += 0.25
        live.update(0)
    assert screen.getvalue().count("\r") == 3  # a terminal redraws whatever the count


def test_a_log_hears_at_once_when_the_words_change_though_the_count_does_not(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    log = io.StringIO()
    bar = Progress("queue q", 100, "img", stream=log)
    for extra in ("", "", "(Redis unreachable, retrying)"):
        clock[0] += 5.0
        bar.update(3, extra=extra)
    assert log.getvalue().splitlines()[-1].endswith("(Redis unreachable, retrying)")
