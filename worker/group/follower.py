"""Ranks other than 0: wait for rank 0's command, do this rank's part, answer, repeat.

A follower never touches Redis. SIGTERM does not stop it by itself: it finishes the batch in
hand and tells rank 0 in its next answer, and rank 0 ends the group after the current job
(``stop``), so every rank leaves together and no collective is left half done.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

from worker.group.comm import EXIT_GROUP_LOST, Answer, Control, GroupLost
from worker.group.engine import RankEngine

log = logging.getLogger("diffq.group")


class Follower:
    def __init__(self, engine: RankEngine, control: Control) -> None:
        self.engine = engine
        self.control = control
        self.stop_asked = False

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if not self.stop_asked:
            name = signal.Signals(signum).name
            log.info("rank %d: %s: the group stops after the current job", self.engine.rank, name)
        self.stop_asked = True

    def serve(self) -> int:
        """Run until rank 0 says stop (its exit code) or the group is lost (:data:`EXIT_GROUP_LOST`)."""
        rank = self.engine.rank
        try:
            while True:
                command = self.control.broadcast()
                if command.kind == "stop":
                    log.info("rank %d: stop from rank 0 (exit %d)", rank, command.exit_code)
                    return command.exit_code
                if command.kind == "batch" and command.work is not None:
                    answer = self.engine.run(command.work)
                else:
                    answer = Answer(rank=rank, dp_rank=self.engine.dp_rank)
                answer.stop = self.stop_asked
                self.control.gather(answer)
        except GroupLost as exc:
            log.error("rank %d: %s; exiting", rank, exc)
            return EXIT_GROUP_LOST
