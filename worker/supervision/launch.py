"""``worker launch``: one ``worker run`` process per GPU, pinned, logged and supervised.

Each child gets ``CUDA_VISIBLE_DEVICES`` in its environment before its interpreter starts,
so torch in the child only ever sees its own GPU as ``cuda:0``. Children run in their own
session: a Ctrl-C in the terminal reaches only the launcher, which then asks every child for
a warm shutdown (finish the current job, take no new one); a second Ctrl-C asks for a cold
one, and children still alive after the grace period are killed.

Children never outlive the launcher, however it dies (SIGKILL, the OOM killer, a crash): each
one holds the read end of a pipe whose write end only the launcher has (``--lifeline``). When
the launcher is gone the read returns, and the child gives its job back to the queue and exits
at once. Writing to a closed stdout (``worker launch | tee log`` and Ctrl-C, which kills
``tee`` too) never stops the launcher from signalling its children: it signals first, then
talks, and a dead stdout is dropped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TextIO

from common.errors import ConfigError

#: what stops the launcher and, forwarded as SIGTERM, its workers: Ctrl-C, SIGTERM and SIGHUP (a
#: closed terminal), as a worker's own (``worker.serving.signals.SIGNALS``)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
MAX_BACKOFF_S = 60.0
STABLE_AFTER_S = 60.0
KILL_GRACE_S = 30.0


@dataclass
class Slot:
    label: str
    visible: str  # value of CUDA_VISIBLE_DEVICES for the child ("" for CPU workers)
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    next_start: float = 0.0
    finished: bool = False
    exit_codes: list[int] = field(default_factory=list)


def parse_gpus(spec: str, visible: list[str] | None = None) -> list[Slot]:
    """``0,1,3`` → those GPUs; ``all`` → every GPU this process may use; ``cpu,cpu`` → two CPU
    workers.

    ``visible`` is the launcher's own ``CUDA_VISIBLE_DEVICES`` (None: not set). Where it is set
    (a Slurm job given GPUs 2 and 5 of a node, a user's choice), ``all`` means those, one worker
    each, pinned to that entry; indices count within it, as CUDA counts them. Unset, ``all`` is
    every GPU ``nvidia-smi`` lists."""
    spec = spec.strip()
    if visible is not None and not visible and spec != "cpu" and not set(spec.split(",")) <= {"cpu"}:
        raise ConfigError(
            f"--gpus {spec}: CUDA_VISIBLE_DEVICES is set and empty, so this process may use no GPU "
            "(a Slurm job without --gres=gpu / --gpus?); ask for GPUs, or use --gpus cpu for CPU workers"
        )
    if spec == "all":
        if visible is not None:
            return [Slot(entry, entry) for entry in visible]
        count = _count_gpus()
        if count == 0:
            raise ConfigError("--gpus all: nvidia-smi lists no GPU here; use --gpus cpu (or cpu,cpu) for CPU workers")
        return [Slot(str(i), str(i)) for i in range(count)]
    if visible is not None:
        slots = parse_gpus(spec)
        for slot in slots:
            if slot.visible and int(slot.visible) >= len(visible):
                raise ConfigError(
                    f"--gpus {spec}: GPU {slot.visible} is not among the {len(visible)} this process may use "
                    f"(CUDA_VISIBLE_DEVICES={','.join(visible)}); indices count within that list"
                )
            if slot.visible:
                slot.visible = visible[int(slot.visible)]
                slot.label = slot.visible
        return slots
    slots: list[Slot] = []
    for n, part in enumerate(p.strip() for p in spec.split(",")):
        if part == "cpu":
            slots.append(Slot(f"cpu{n}", ""))
        elif part.isdigit():
            if any(s.visible == part for s in slots):
                raise ConfigError(f"--gpus {spec}: GPU {part} is listed twice; one worker per GPU")
            slots.append(Slot(part, part))
        else:
            raise ConfigError(f"--gpus {spec}: {part!r} is not a GPU index; use e.g. 0,1,2,3 or all or cpu,cpu")
    if not slots:
        raise ConfigError("--gpus is empty; use e.g. 0,1,2,3 or all")
    return slots


def _count_gpus() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


class Launcher:
    def __init__(self, slots: list[Slot], run_args: list[str], burst: bool, out: TextIO | None = None) -> None:
        self.slots = slots
        self.run_args = run_args
        self.burst = burst
        self.out = out or sys.stdout
        self.stopping = 0  # 0 running, 1 warm stop asked, 2 cold stop asked
        self.stop_deadline = float("inf")
        self._lock = threading.Lock()
        self._out_dead = False
        # the children read this pipe; only this process holds its write end (see the module doc)
        self._lifeline, self._lifeline_write = os.pipe()

    def say(self, label: str, line: str) -> None:
        """One prefixed line on our stdout; if that is gone (``| tee`` killed), drop it."""
        with self._lock:
            if self._out_dead:
                return
            try:
                self.out.write(f"[gpu {label}] {line.rstrip()}\n")
                self.out.flush()
            except (BrokenPipeError, OSError, ValueError):
                self._out_dead = True

    def _env(self, slot: Slot) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = slot.visible
        env["DIFFQ_GPU"] = slot.label
        env["PYTHONUNBUFFERED"] = "1"
        base = int(env.get("DIFFQ_METRICS_PORT") or 0)
        if base:  # one port per child: the first child's is the given one
            env["DIFFQ_METRICS_PORT"] = str(base + self.slots.index(slot))
        if not slot.visible:  # CPU stand-ins share the cores instead of oversubscribing them
            cpu_slots = sum(1 for s in self.slots if not s.visible)
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cpu_slots)))
        return env

    def _start(self, slot: Slot) -> None:
        args = [sys.executable, "-m", "worker", "run", *self.run_args, "--lifeline", str(self._lifeline)]
        if not slot.visible:
            args += ["--device", "cpu"]
        slot.proc = subprocess.Popen(
            args,
            env=self._env(slot),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
            pass_fds=(self._lifeline,),
        )
        slot.started_at = time.monotonic()
        threading.Thread(target=self._pump, args=(slot, slot.proc), daemon=True).start()
        self.say(slot.label, f"launcher: started worker pid {slot.proc.pid} (CUDA_VISIBLE_DEVICES={slot.visible!r})")

    def _pump(self, slot: Slot, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.say(slot.label, line)

    def request_stop(self, signum: int, _frame: object) -> None:
        self.stopping = min(self.stopping + 1, 2)
        # a warm stop waits for current jobs however long they take; a cold one gets a grace period
        self.stop_deadline = float("inf") if self.stopping == 1 else time.monotonic() + KILL_GRACE_S
        for slot in self.slots:  # the children first: saying so may fail (see say)
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signal.SIGTERM)
        kind = "warm (finish current jobs)" if self.stopping == 1 else "cold (stop now)"
        self.say("*", f"launcher: {signal.Signals(signum).name}: {kind} shutdown of all workers")

    def run(self) -> int:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.request_stop)
        for slot in self.slots:
            self._start(slot)
        while not all(s.finished for s in self.slots):
            time.sleep(0.2)
            for slot in self.slots:
                self._check(slot)
            if time.monotonic() > self.stop_deadline:
                for slot in self.slots:
                    if slot.proc is not None and slot.proc.poll() is None:
                        self.say(slot.label, "launcher: still running after the grace period, killing it")
                        slot.proc.kill()
        failed = [s for s in self.slots if s.exit_codes and s.exit_codes[-1] != 0]
        return 1 if failed and not self.stopping else 0

    def _check(self, slot: Slot) -> None:
        if slot.finished:
            return
        if slot.proc is None:
            if self.stopping:
                slot.finished = True
            elif time.monotonic() >= slot.next_start:
                self._start(slot)
            return
        code = slot.proc.poll()
        if code is None:
            return
        slot.exit_codes.append(code)
        slot.proc = None
        if self.stopping or (code == 0 and self.burst):
            slot.finished = True
            self.say(slot.label, f"launcher: worker exited ({code})")
            return
        if time.monotonic() - slot.started_at > STABLE_AFTER_S:
            slot.restarts = 0
        delay = min(MAX_BACKOFF_S, 2.0**slot.restarts)
        slot.restarts += 1
        slot.next_start = time.monotonic() + delay
        self.say(slot.label, f"launcher: worker exited with {code}; restarting in {delay:.0f}s")
