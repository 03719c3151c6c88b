"""Model presets: names a job can use in place of a hub id or a folder.

These are plain data so the producer can print and check them without importing torch;
``worker/pipelines/models.py`` knows how to build each one.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from common import checkpoints
from common.errors import ConfigError, InvalidJobSpec
from common.families import folder_pipeline, refusal, runs_here

DEFAULT_MODEL = "stabilityai/stable-diffusion-xl-base-1.0"

#: Built-in models. ``tiny`` is written once to the cache folder and then loaded with
#: ``from_pretrained`` like any model; ``sdxl-random`` is built in memory on the device.
MODEL_PRESETS: dict[str, str] = {
    "tiny": "small SDXL-architecture pipeline with random weights (CPU tests and the demo)",
    "sdxl-random": "full SDXL-base architecture with random weights (GPU benchmarks; same FLOPs)",
    "flux-random": "FLUX.1-dev architecture (12 B DiT, T5-XXL) with random weights (xDiT group benchmarks)",
    "sd3-random": "SD3.5-medium architecture (2.5 B MMDiT, two CLIPs, T5-XXL) with random weights (GPU benchmarks)",
    "pixart-random": "PixArt-Σ-XL 1024 architecture (0.6 B DiT, T5-XXL) with random weights (GPU benchmarks)",
    "tiny-sd3": "small SD3-architecture pipeline with random weights (CPU tests of the SD3 family)",
    "tiny-pixart": "small PixArt-Σ-architecture pipeline with random weights (CPU tests of the PixArt family)",
}

#: A preset's own defaults for the size and steps a row and the flags leave open: ``tiny`` is
#: for CPUs, where SDXL's 1024² would take over ten minutes a step (the demo's 128², 8 steps
#: take seconds), so the docs' commands run as written on a host without GPUs.
PRESET_DEFAULTS: dict[str, dict[str, int]] = {
    name: {"width": 128, "height": 128, "steps": 8} for name in ("tiny", "tiny-sd3", "tiny-pixart")
}


def preset_default(model: str, name: str, fallback: int) -> int:
    """``name``'s default for ``model``: the preset's own, else ``fallback`` (the job spec's)."""
    return PRESET_DEFAULTS.get(model, {}).get(name, fallback)


#: Speed levers a worker can switch on (``--speedups`` / ``DIFFQ_SPEEDUPS``); worker/pipelines/speedups.py
#: applies them. docs/usage.md's lever table gives each one's measured gain; ``make lint`` checks
#: that the table names exactly these.
SPEEDUP_LEVERS: dict[str, str] = {
    "vae-fp16": "decode in fp16 instead of SDXL's default fp32 upcast (checked finite; falls back to fp32)",
    "fuse-qkv": "fused QKV projections in the UNet's (FLUX: the transformer's) attention",
    "compile-blocks": "torch.compile of the denoiser's repeated transformer blocks (regional; ~10 s more warm-up)",
    "compile-unet": "torch.compile of the whole UNet as one graph (instead of compile-blocks)",
    "compile-vae": "torch.compile of the VAE decoder (one graph; more warm-up)",
    "persistent-norms": "compiled LayerNorms of up to 2048 channels read each row once (SDXL's 1280; with compile-*)",
    "cuda-graphs": "the UNet's calls of up to 8 rows replayed as CUDA graphs (batch 1-4: where the host is the limit)",
    "encoder-graphs": "the text encoders' calls of up to 8 prompts replayed as CUDA graphs (a prompt's encode)",
    "empty-negative": "an empty negative prompt's half of a batch skips cross-attention (SDXL zeroes it; same images)",
}

#: levers a worker no longer takes, each with the reason a user who names one reads
RETIRED_LEVERS: dict[str, str] = {
    "channels-last": "retired: 8 % slower than the default layout on an H200",
    "cudnn-benchmark": "retired: cuDNN's timed algorithms gained nothing over its heuristics on an H100",
    "compile-resnets": "retired: it only served the regional compile; compile-unet fuses the ResNet blocks",
    "modulation-once": "retired as a lever: FLUX computes an image's modulation vectors once by default now",
    "fp8": "not a lever: use --precision fp8 (DIFFQ_PRECISION=fp8)",
}

#: what ``--speedups auto`` means on CUDA, for each model family's worker and for an xDiT group:
#: the one place the defaults are declared (docs/usage.md's lever table shows why each is on).
#: SDXL: ``empty-negative`` 1.010 -> 1.041 img/s on an H100 through the queue, images within
#: 1/255. FLUX: its blocks compiled (5.07 -> 3.90 s an image on an H200) and its decoder
#: (3.76 -> 3.72 s at 1024², 41.0 -> 36.5 GiB at 2048²). A group adds CUDA graphs of its small
#: calls and of the text encoders (a Ulysses-4 FLUX image 3.37 -> 1.54 s on 4 H100s; one SDXL
#: prompt's encode 37.3 -> 9.2 ms), docs/groups.md.
AUTO_SPEEDUPS: dict[str, tuple[str, ...]] = {
    "sdxl": ("vae-fp16", "compile-unet", "compile-vae", "empty-negative"),
    "flux": ("vae-fp16", "compile-blocks", "compile-vae"),
    "sd3": ("compile-blocks", "compile-vae"),
    "pixart": ("compile-blocks", "compile-vae"),
    "group": ("vae-fp16", "compile-unet", "compile-vae", "compile-blocks", "cuda-graphs", "encoder-graphs"),
}
CUDA_DEFAULT_SPEEDUPS = AUTO_SPEEDUPS["sdxl"]

#: what the denoiser computes in (``--precision`` / ``DIFFQ_PRECISION``); worker/pipelines/fp8.py
PRECISIONS: dict[str, str] = {
    "fp16": "the weights' dtype (--dtype: fp16 on CUDA by default)",
    "fp8": "wide linear layers in FP8 with static scales calibrated once per model (Ada/Hopper; else fp16)",
}

#: where a worker keeps the pipeline's weights (``--offload`` / ``DIFFQ_OFFLOAD``); worker/pipelines/offload.py
OFFLOAD_MODES: dict[str, str] = {
    "auto": "none where the pipeline and a batch of two fit in the GPU's memory, else the lightest that fits",
    "none": "every component on the GPU (fastest; SDXL fp16 holds 6.6 GB of weights there)",
    "model": "components on the CPU, each moved to the GPU for its turn (diffusers' enable_model_cpu_offload)",
    "sequential": "layers streamed to the GPU one at a time (enable_sequential_cpu_offload; ~4 GB, 15x slower)",
}


def auto_help() -> str:
    """What ``auto`` means, family by family, for a flag's help."""
    return "; ".join(f"{name}: {','.join(levers)}" for name, levers in AUTO_SPEEDUPS.items())


def speedup_names(text: str) -> frozenset[str]:
    """The levers named by ``text``. ``auto`` among them stands for the device's defaults, which
    the worker fills in (``auto,persistent-norms``: the defaults and one more)."""
    text = text.strip()
    if text in ("", "none"):
        return frozenset()
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    retired = sorted(names & set(RETIRED_LEVERS))
    if retired:
        raise ConfigError(f"--speedups / DIFFQ_SPEEDUPS: {retired[0]} is {RETIRED_LEVERS[retired[0]]}; drop it")
    unknown = names - set(SPEEDUP_LEVERS) - {"auto"}
    if unknown:
        raise ConfigError(
            f"--speedups / DIFFQ_SPEEDUPS: unknown lever(s) {', '.join(sorted(unknown))}; use auto, none or a "
            f"list of {', '.join(SPEEDUP_LEVERS)} (auto among them: the device's defaults and those)"
        )
    return names


#: Built-in adapters, resolved by the worker to a folder in its cache.
ADAPTER_PRESETS: dict[str, str] = {
    "tiny-dora": "a DoRA adapter (peft, use_dora=True) with random weights for the tiny model",
}

#: ``org/name`` as the Hugging Face Hub spells repository ids
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

#: Built-in preview decoders (``--decoder``; worker/pipelines/preview.py); a hub id such as
#: ``madebyollin/taesdxl`` or a folder is the real one
DECODER_PRESETS: dict[str, str] = {
    "taesdxl-random": "TAESD-XL's architecture with random weights (benchmarks)",
    "tiny-taesd": "a toy AutoencoderTiny for the tiny model (tests)",
}


def check_decoder(name: str, value: object) -> None:
    """A ``decoder`` is a preset, a folder or a hub id: a name of none of those shapes (a typo
    of a preset, ``taesdxl`` without its org) is the row's error, said before anything is queued.
    Whether a folder or hub id holds a decoder is the worker's to find (it may see other mounts)."""
    if value is None:
        return
    if not isinstance(value, str) or not value.strip():
        raise InvalidJobSpec(f"{name} must be a decoder name")
    if value in DECODER_PRESETS or value.startswith(("/", ".", "~")) or HUB_ID.match(value):
        return
    close = difflib.get_close_matches(value, DECODER_PRESETS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise InvalidJobSpec(
        f"{name} {value!r} is neither a preset{hint}, nor a path, nor a hub id like madebyollin/taesdxl; "
        f"presets: {', '.join(DECODER_PRESETS)}"
    )


def check_model(name: str) -> None:
    """What the producer can know about ``--model`` without asking the Hub: a preset, a
    diffusers folder here, a single-file checkpoint here, or something shaped like a hub id. A typo such as ``tinyy`` is
    caught before anything is enqueued, not by every worker failing every job."""
    if name in MODEL_PRESETS:
        return
    path = Path(name).expanduser()
    if path.is_file():
        check_single_file(name, path)
        return
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise ConfigError(f"--model {name!r}: the folder has no model_index.json; give a diffusers pipeline folder")
        pipeline = folder_pipeline(path)
        if pipeline is not None and not runs_here(pipeline):
            raise ConfigError(f"--model {name!r} {refusal(pipeline)}")
        return
    if name.startswith(("/", ".", "~")) or not HUB_ID.match(name):
        close = difflib.get_close_matches(name, MODEL_PRESETS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"--model {name!r} is neither a preset{hint}, nor a folder or .safetensors file here, nor a hub id "
            "like org/name; "
            f"presets: {', '.join(MODEL_PRESETS)}"
        )


def check_single_file(name: str, path: Path) -> None:
    """A single-file checkpoint (``--model fine-tune.safetensors``): a safetensors file whose
    keys make a whole model of a pipeline diffq runs, read from its header at enqueue."""
    if path.suffix not in checkpoints.SINGLE_FILE_SUFFIXES:
        raise ConfigError(
            f"--model {name!r} is a {path.suffix or 'suffix-less'} file; diffq loads single-file checkpoints from "
            ".safetensors only (a .ckpt is a pickle that runs code when loaded: convert it to safetensors first)"
        )
    try:
        checkpoints.runnable_pipeline(path)
    except checkpoints.Unrunnable as exc:
        raise ConfigError(f"--model {name!r}{exc}") from None


def adapter_path(adapter: str, *, check: bool = True) -> str:
    """What a job stores for ``adapter``: a preset's name, or an absolute path, so every worker
    reads the same file whatever its own folder. A relative path is made absolute here (against
    the producer's folder) when ``check`` is on, and checked (:func:`check_adapter`); with the
    checks off (only the workers see the path) it must be absolute already."""
    if adapter in ADAPTER_PRESETS:
        return adapter
    path = Path(adapter).expanduser()
    if not path.is_absolute():
        if not check:
            raise InvalidJobSpec(
                f"adapter {adapter!r} is a relative path: each worker would read it from its own folder; "
                "give an absolute path"
            )
        path = path.absolute()
    if check:
        check_adapter(str(path))
    return str(path)


#: a LoRA or DoRA file names at least one tensor with one of these in its key (PEFT, diffusers, kohya)
ADAPTER_KEY_PARTS = ("lora_A", "lora_B", "lora_down", "lora_up", "lora.down", "lora.up", "lora_magnitude_vector")


def check_adapter(adapter: str) -> None:
    """An adapter is a preset, a LoRA/DoRA ``.safetensors`` file, or a folder holding one. The
    file's header is read (its keys and dtypes, not the tensors): a file that is not safetensors,
    or holds no LoRA weights, is refused here rather than by every worker. If this machine cannot
    see the path, the row is refused too (``--no-path-checks`` when only the workers see it)."""
    if adapter in ADAPTER_PRESETS:
        return
    path = Path(adapter).expanduser()
    if not path.exists():
        raise InvalidJobSpec(
            f"adapter {adapter!r} does not exist here: give a DoRA/LoRA folder or .safetensors file, or a preset "
            f"({', '.join(ADAPTER_PRESETS)}); if only the workers see that path, pass --no-path-checks"
        )
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise InvalidJobSpec(f"adapter {adapter!r} is a folder with no .safetensors file: give a LoRA/DoRA folder")
        problems = [why for f in files if (why := _adapter_file_problem(f)) is not None]
        if len(problems) == len(files):
            raise InvalidJobSpec(f"adapter {adapter!r}: {problems[0]}")
        return
    why = _adapter_file_problem(path)
    if why is not None:
        raise InvalidJobSpec(f"adapter {adapter!r}: {why}")


def _adapter_file_problem(path: Path) -> str | None:
    """Why ``path`` is not a LoRA/DoRA safetensors file, or None. Reads 8 bytes and the header."""
    if path.suffix != ".safetensors":
        return f"{path.name} is not a .safetensors file (LoRA/DoRA weights are read from safetensors only)"
    try:
        tensors = checkpoints.header(path)
    except checkpoints.NotSafetensors as exc:
        return str(exc)
    if not any(part in key for key in tensors for part in ADAPTER_KEY_PARTS):
        return f"{path.name} holds no LoRA/DoRA weights (no key with {', '.join(ADAPTER_KEY_PARTS[:2])}, ...)"
    return None
