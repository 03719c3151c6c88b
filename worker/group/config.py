"""A group's parallel layout: how many ways each image is split, and how the ranks agree.

The layout must use every rank: ulysses × ring × pipefusion × data-parallel (× 2 with CFG
parallel) = the world size torchrun started. A wrong product is a config error found before
any rank touches a GPU or Redis, so every rank exits at once with the same arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import ConfigError

#: seconds a rank waits in one of the group's own collectives before it calls the group lost. It must
#: exceed the longest wait of one rank for another inside a batch (a data-parallel rank with a
#: short slice waits for the longest one); a rank that dies is noticed sooner, by torchrun and by
#: its closed connections (3.8 s in tests/test_group.py). The timeout catches ranks that hang.
DEFAULT_TIMEOUT_S = 300


@dataclass(frozen=True)
class GroupLayout:
    ulysses_degree: int = 1
    ring_degree: int = 1
    pipefusion_degree: int = 1
    cfg_parallel: bool = False
    data_parallel_degree: int = 1
    parallel_vae: bool = False
    timeout_s: int = DEFAULT_TIMEOUT_S

    @classmethod
    def load(cls, **flags: int | bool | None) -> GroupLayout:
        """The layout the group's flags give (``--ulysses-degree``, ...; one unset keeps its default)."""
        values = {name: flag for name, flag in flags.items() if flag is not None and flag is not False}
        layout = cls(**values)  # type: ignore[arg-type]
        for name in ("ulysses_degree", "ring_degree", "pipefusion_degree", "data_parallel_degree", "timeout_s"):
            if getattr(layout, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(layout, name)}")
        return layout

    @property
    def cfg_degree(self) -> int:
        return 2 if self.cfg_parallel else 1

    @property
    def size(self) -> int:
        """Ranks this layout uses."""
        split = self.ulysses_degree * self.ring_degree * self.pipefusion_degree
        return split * self.data_parallel_degree * self.cfg_degree

    @property
    def model_parallel(self) -> bool:
        """Whether one image is split over ranks (then xDiT runs it); data parallel alone is ours."""
        return self.ulysses_degree * self.ring_degree * self.pipefusion_degree * self.cfg_degree > 1

    def arithmetic(self) -> str:
        parts = [
            f"ulysses {self.ulysses_degree}",
            f"ring {self.ring_degree}",
            f"pipefusion {self.pipefusion_degree}",
            f"data-parallel {self.data_parallel_degree}",
        ]
        if self.cfg_parallel:
            parts.append("cfg-parallel 2")
        return " × ".join(parts) + f" = {self.size}"

    def check_world(self, world_size: int) -> None:
        if self.size == world_size:
            return
        raise ConfigError(
            f"the degrees use {self.size} rank(s) but torchrun started {world_size}: {self.arithmetic()}, "
            f"not {world_size}; make the product equal --nproc-per-node "
            f"(e.g. --data-parallel-degree {world_size}, or --ulysses-degree {world_size} for a DiT model)"
        )

    def describe(self) -> str:
        vae = ", parallel VAE" if self.parallel_vae else ""
        return self.arithmetic() + f" ranks{vae}, collective timeout {self.timeout_s}s"


def dp_slice(batch: int, dp_degree: int, dp_rank: int) -> range:
    """The images of a batch that data-parallel rank ``dp_rank`` makes: contiguous, ceil-sized
    (the same split xDiT's data parallel uses), possibly empty for the last ranks."""
    per = -(-batch // dp_degree)
    return range(min(dp_rank * per, batch), min((dp_rank + 1) * per, batch))
