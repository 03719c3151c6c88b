"""One rank's pipeline, and the part of each batch that rank computes.

How an image is split, by model family:
- SDXL: CFG parallel is ours. The UNet's batch is ``[unconditional; conditional]``; with
  ``--cfg-parallel`` the two ranks of a pair each run one half and exchange their noise
  predictions every step (an ``all_gather`` of B×4×H/8×W/8 values), so each UNet call costs
  half; each rank then decodes half of the batch's images and they exchange the pixels (an odd
  batch's last image, batch 1's only one, is decoded split by rows over the pair).
  xDiT 0.7.0's SDXL wrapper calls the unchanged diffusers pipeline (its UNet is not converted),
  which is why it measured slower on two GPUs than on one.
- FLUX (a DiT): Ulysses alone or ring alone over every rank is diffusers' own context
  parallelism (:mod:`worker.group.token_split`: its blocks compile as one graph with the
  collectives inside; each transformer call is then one CUDA graph). PipeFusion, the parallel
  VAE, Ulysses beside ring and either beside data parallelism are xDiT's: the pipeline is
  wrapped in ``xFuserFluxPipeline`` and only the rank xDiT hands the result to holds the images.
- Data parallel is ours for both: data-parallel rank ``d`` makes the ``d``-th contiguous slice
  of the batch (the same split as xDiT's), and prompts go in as embeddings so xDiT does not
  split them a second time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from common.errors import ConfigError
from common.jobspec import GenParams
from common.presets import AUTO_SPEEDUPS, speedup_names
from common.settings import Settings
from worker.group import split_decode, token_split
from worker.group.comm import Answer
from worker.group.config import GroupLayout, dp_slice
from worker.pipelines import empty_negative, modulation, step_graphs
from worker.pipelines.families import family_of
from worker.pipelines.generate import is_oom, run_split
from worker.pipelines.pixels import BatchResult
from worker.pipelines.warm import LoadedPipeline, WarmPipelines
from worker.serving.failures import classify

log = logging.getLogger("diffq.group")


#: what ``--speedups auto`` means for a group on CUDA (common/presets.AUTO_SPEEDUPS, where every
#: default is declared): an SDXL group takes the single worker's compiled UNet and decoder and
#: replays the UNet's small calls as CUDA graphs (a CFG pair at batch 1 launches a whole image's
#: kernels for half the rows: the host is its limit); a FLUX group compiles its blocks and, split
#: with Ulysses, replays each transformer call as one graph; every rank's text encoders are graphed
GROUP_CUDA_DEFAULT = ",".join(AUTO_SPEEDUPS["group"])
#: a FLUX call's rows are its images (no CFG batch): every call of a Ulysses group is graphed.
#: Why (FLUX 1024², 28 steps, compiled blocks, docs/groups.md): each rank launches the split's
#: all-to-alls and layout copies beside the blocks' kernels, and the GPUs waited on the host:
#: Ulysses 2 took 2.58 s per image against 2.70 s without graphs (2 H100s), Ulysses 4 1.54 s
#: against 3.37 s (4 H100s; one GPU 3.96 s); the graphs added 0.07 GiB at peak. A ring's
#: calls are graphed the same way (2.50 s, 2 H100s)
ALL_ROWS = 1 << 30


def group_speedups(speedups: str, layout: GroupLayout, cuda: bool) -> str:
    """The levers a group's ranks load with: ``auto`` on CUDA is :data:`GROUP_CUDA_DEFAULT`, and a
    ring's takes ``fuse-qkv`` too (only a DiT splits into a ring). Why: a ring rank's q, k and v
    at half an image's rows as three products leave SMs idle where one three times as wide does
    not; FLUX 1024² on a ring of 2 took 2.191 → 2.152 s with it, where one GPU was no faster (2
    H200s, docs/groups.md), for 4 GiB more a rank (the parts are kept for adapters). Under
    ``--parallel-vae`` ``compile-vae`` is left out: xDiT decodes with its own copy of the decoder."""
    named = speedup_names(speedups)
    if "auto" in named and cuda:
        ring = ["fuse-qkv"] if layout.ring_degree > 1 else []
        speedups = ",".join([GROUP_CUDA_DEFAULT, *ring, *sorted(named - {"auto"})])
    if layout.parallel_vae and "compile-vae" in speedup_names(speedups):
        speedups = ",".join(sorted(speedup_names(speedups) - {"compile-vae"})) or "none"
        log.info("speedups: compile-vae is left out: --parallel-vae decodes with xDiT's own decoder")
    return speedups


class RankEngine:
    def __init__(self, settings: Settings, layout: GroupLayout, rank: int, world: int) -> None:
        self.settings = settings
        self.layout = layout
        self.rank = rank
        self.world = world
        self.per_dp = world // layout.data_parallel_degree
        self.dp_rank = rank // self.per_dp
        self.holder = True  # whether this rank ends a batch with its dp group's images
        self.token_split: tuple[str, int] | None = None  # FLUX split by diffusers (worker/group/token_split.py)
        self.graphs_hold_collectives = False  # CUDA graphs that captured NCCL's collectives
        # a group's own defaults, measured under its splits (docs/benchmarks.md): compile-blocks
        # takes FLUX under Ulysses 2 from 3.76 to 2.72 s (2 H200s); for SDXL under CFG parallel at
        # batch 1 the whole UNet took 1.460 s where compile-blocks took 1.854 s (2 H100s)
        cuda = settings.device != "cpu" and torch.cuda.is_available()
        speedups = group_speedups(settings.speedups, layout, cuda)
        self.pipelines = WarmPipelines.from_settings(settings, speedups=speedups, offload="none", gpu_memory=0.0)
        self.loaded: LoadedPipeline | None = None
        self.cfg_group: Any = None
        if layout.cfg_parallel:
            # every rank creates every pair's group, in the same order, before anyone loads
            pairs = [[d * 2, d * 2 + 1] for d in range(layout.data_parallel_degree)]
            self.cfg_group = [dist.new_group(ranks) for ranks in pairs][self.dp_rank]

    @property
    def model(self) -> str:
        return self.loaded.model if self.loaded else ""

    def load(self, model: str) -> float:
        """Load ``model``'s weights on this rank (ranks may take different times)."""
        self.loaded, seconds = self.pipelines.get(model)
        return seconds

    def split(self) -> None:
        """Split the loaded model as the layout says; every rank calls this together."""
        loaded = self.loaded
        assert loaded is not None
        model = loaded.model
        kind = family_of(loaded.pipe)
        family, flux = kind.title, "ulysses" in kind.splits  # a DiT the token splits take
        layout = self.layout
        if "ulysses" not in kind.splits and layout.ulysses_degree * layout.ring_degree * layout.pipefusion_degree > 1:
            raise ConfigError(
                f"{model} is {_a(family)} model: a group splits it with "
                f"{'--cfg-parallel and ' if 'cfg' in kind.splits else ''}--data-parallel-degree only; "
                "--ulysses-degree, --ring-degree and --pipefusion-degree are for DiT models such as FLUX"
            )
        if "cfg" not in kind.splits and layout.cfg_parallel:
            raise ConfigError(
                f"{model} is {_a(family)} model"
                + (": FLUX.1 is guidance-distilled and has no CFG pass to split; " if not kind.negative_prompt else
                   ": a group splits its CFG pass only for SDXL; ")
                + "drop --cfg-parallel"
                + (" and use --ulysses-degree / --ring-degree" if flux else "")
            )  # fmt: skip
        if layout.parallel_vae and not ("parallel-vae" in kind.splits and layout.model_parallel):
            raise ConfigError(
                f"--parallel-vae splits a DiT's decoder under xDiT (--ulysses-degree / --ring-degree / "
                f"--pipefusion-degree above 1); {model} in this layout decodes on one rank"
                + ("" if flux or "cfg" not in kind.splits else
                   f" ({_a(family)} CFG pair already splits its decode: half of the images on each rank)")
            )  # fmt: skip
        how = "data parallel" if self.layout.data_parallel_degree > 1 else "none (one rank makes each image)"
        taken = token_split.takes(self.layout) if flux else None
        if taken:
            way, degree = taken
            token_split.split(loaded.pipe, way, degree, model)
            self.token_split = taken
            self.holder = self.rank == 0  # every rank ends with the whole image; one answers
            by = "diffusers' split, our ring attention" if way == "ring" else "diffusers"
            how = f"{way.capitalize()} {degree} ({by})"
            if split_decode.install(loaded.pipe.vae, dist.group.WORLD):
                how += ", the decoder split by rows"
            if "cuda-graphs" in loaded.speedups and step_graphs.install(loaded.pipe.transformer, ALL_ROWS):
                self.graphs_hold_collectives = True
                how += ", each transformer call one CUDA graph"
        elif flux and self.layout.model_parallel:
            loaded.pipe = self._wrap_xdit(loaded.pipe, model)
            how = f"xDiT, {self.layout.arithmetic()}"
        elif self.layout.cfg_parallel:
            how = f"CFG parallel, {self.layout.arithmetic()}"
            if self._split_cfg(loaded.pipe):
                how += ", an odd batch's last image decoded split by rows"
        log.info(
            "rank %d: %s model %s split: %s; ready (dp rank %d, holds images: %s)",
            self.rank,
            family,
            model,
            how,
            self.dp_rank,
            self.holder,
        )

    # -- the two ways an image is split ----------------------------------------------------

    def _split_cfg(self, pipe: Any) -> bool:
        """Returns whether the decoder splits by rows (an odd batch's last image)."""
        group = self.cfg_group
        half = self.rank % 2
        self.holder = half == 0
        unet = pipe.unet
        forward = unet.forward

        def split_forward(
            sample: torch.Tensor, timestep: Any, encoder_hidden_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> Any:
            if not pipe.do_classifier_free_guidance:
                return forward(sample, timestep, encoder_hidden_states, *args, **kwargs)
            rows = sample.shape[0] // 2

            def mine(value: Any) -> Any:
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == 2 * rows:
                    return value[half * rows : (half + 1) * rows]
                if isinstance(value, dict):
                    return {k: mine(v) for k, v in value.items()}
                return value

            kwargs = {k: mine(v) for k, v in kwargs.items()}
            if "cross_attention_kwargs" in kwargs:  # the empty negative's zero rows among this half's
                kwargs["cross_attention_kwargs"] = empty_negative.for_rows(
                    kwargs["cross_attention_kwargs"], half * rows, rows
                )
            kwargs["return_dict"] = False
            out = forward(mine(sample), mine(timestep), mine(encoder_hidden_states), *args, **kwargs)[0]
            both = [torch.empty_like(out) for _ in range(2)]
            dist.all_gather(both, out.contiguous(), group=group)
            return (torch.cat(both),)

        split_forward.graphs = step_graphs.installed(pipe)  # type: ignore[attr-defined]  # for adapter switches
        unet.forward = split_forward
        rows_split = split_decode.install(pipe.vae, group)
        decode = pipe.vae.decode

        def pair_decode(z: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            """Each rank of the pair decodes half of the batch's images by itself (the VAE decodes
            each image on its own, so the pixels are the same), and an odd batch's last image is
            decoded split by rows over the pair (:mod:`worker.group.split_decode`; whole on both
            ranks where the decoder does not split); then both hold all of them. At batch 4 the
            decode is a twentieth of a CFG-parallel batch; at batch 1 one rank decoded the image
            while the other waited (H100: 0.052 of a 0.71 s job)."""
            rows = z.shape[0]
            if args or kwargs.get("return_dict", True):
                return decode(z, *args, **kwargs)
            each = rows // 2
            parts: list[torch.Tensor] = []
            if each:
                with split_decode.alone(pipe.vae):
                    part = decode(z[half * each : (half + 1) * each], return_dict=False)[0]
                parts = [torch.empty_like(part) for _ in range(2)]
                dist.all_gather(parts, part.contiguous(), group=group)
            if rows % 2:
                parts.append(decode(z[rows - 1 :], return_dict=False)[0])
            return (torch.cat(parts),)

        pipe.vae.decode = pair_decode
        return rows_split

    def _wrap_xdit(self, pipe: Any, model: str) -> Any:
        try:
            from xfuser import xFuserArgs, xFuserFluxPipeline
            from xfuser.core.distributed import init_distributed_environment
        except ImportError as exc:
            raise ConfigError(
                "--pipefusion-degree, --parallel-vae, --ulysses-degree beside --ring-degree, and either beside "
                f"--data-parallel-degree need xDiT: pip install xfuser==0.7.0 ({exc})"
            ) from None
        init_distributed_environment()  # xDiT's world group over the process group we made
        modulation.remove(pipe)  # xDiT runs its own loop (PipeFusion calls per patch); its layers compute
        args = xFuserArgs(
            model=model,
            ulysses_degree=self.layout.ulysses_degree,
            ring_degree=self.layout.ring_degree,
            pipefusion_parallel_degree=self.layout.pipefusion_degree,
            use_cfg_parallel=False,
            data_parallel_degree=self.layout.data_parallel_degree,
            use_parallel_vae=self.layout.parallel_vae,
        )
        engine_config, _ = args.create_config()
        engine_config.runtime_config.dtype = self.pipelines.dtype if pipe.dtype is None else pipe.dtype
        wrapped = xFuserFluxPipeline(pipe, engine_config)
        # the pipeline's own answer: under the parallel VAE the images end on world rank 0,
        # otherwise on the last rank of each data-parallel group
        self.holder = bool(wrapped.is_dp_last_group())
        return wrapped

    # -- one batch ---------------------------------------------------------------------------

    def run(self, work: dict[str, Any], on_step: Callable[[int, int], None] | None = None) -> Answer:
        """This rank's part of one batch; any exception becomes the answer's error, never a raise."""
        answer = Answer(rank=self.rank, dp_rank=self.dp_rank)
        try:
            result = self._run(work, on_step)
        except Exception as exc:
            failure = classify(exc)
            answer.error = f"rank {self.rank}: {failure.reason}"
            answer.permanent = failure.permanent
            answer.oom = is_oom(exc)
            log.error("rank %d: batch failed: %s", self.rank, failure.reason)
            return answer
        if result is not None:
            answer.timings = {"encode_s": result.encode_s, "denoise_s": result.denoise_s, "decode_s": result.decode_s}
            if self.holder:
                answer.images = list(result.images)
        elif self.holder:
            answer.images = []
        return answer

    def _run(self, work: dict[str, Any], on_step: Callable[[int, int], None] | None) -> BatchResult | None:
        assert self.loaded is not None
        params = GenParams(**work["params"])
        prompts: list[str] = work["prompts"]
        span = dp_slice(len(prompts), self.layout.data_parallel_degree, self.dp_rank)
        if not span:
            return None
        if self.token_split:
            token_split.check_size(self.loaded.pipe, *self.token_split, params.width, params.height)
        self.pipelines.use_adapters(self.loaded, params.stack())
        result, _fitted = run_split(
            self.loaded.pipe,
            params,
            prompts=[prompts[i] for i in span],
            negatives=[work["negatives"][i] for i in span],
            seeds=[work["seeds"][i] for i in span],
            max_batch=work["max_batch"],
            on_step=on_step,
        )
        return result


def _a(title: str) -> str:
    """``title`` with its article as it is said: "an SDXL", "an SD3", "a FLUX", "a PixArt"."""
    if title.startswith(("a ", "an ")):
        return title
    return f"{'an' if title[:1] in 'AEFHILMNORSX' and title[:2] != 'FL' else 'a'} {title}"
