"""What a ``.safetensors`` file is, read from its header alone (keys, dtypes, shapes; no tensor).

Two questions use it: is an adapter file LoRA/DoRA weights (:mod:`common.presets`), and which
pipeline a single-file checkpoint is (the way most fine-tuned SDXL models are shared: one
``.safetensors`` with the UNet, the VAE and both text encoders under the original Stability
key names). The producer answers both at enqueue, without torch, so a file that no family
runs is refused with its flag or row rather than downloaded and given back by every worker.
The key names are the ones diffusers' single-file loader recognises
(``diffusers.loaders.single_file_utils.CHECKPOINT_KEY_NAMES``); tests/test_single_file.py
checks this table against them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.families import refusal, runs_here

#: what a safetensors header may name as a tensor's dtype
SAFETENSORS_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32", "I16", "I8", "U8", "BOOL"}
#: a header larger than this is no checkpoint's (a whole SDXL file's is about 0.2 MB)
MAX_HEADER_BYTES = 64 << 20
#: the suffixes a single-file checkpoint is read from (``.ckpt`` is a pickle: it runs code when
#: loaded, so it is refused with how to convert it)
SINGLE_FILE_SUFFIXES = (".safetensors",)


class NotSafetensors(ValueError):
    """The file is not a readable safetensors file; the message says why, naming the file."""


def header(path: Path) -> dict[str, dict[str, Any]]:
    """The tensors a safetensors file declares (name -> dtype, shape, offsets), its
    ``__metadata__`` left out. Reads 8 bytes and the header, never the tensors."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
            size = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 2 <= size <= MAX_HEADER_BYTES:
                raise NotSafetensors(f"{path.name} is not a safetensors file (no header)")
            table = json.loads(handle.read(size))
    except OSError as exc:
        raise NotSafetensors(f"{path.name} cannot be read here ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise NotSafetensors(f"{path.name} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(table, dict):
        raise NotSafetensors(f"{path.name} is not a safetensors file (its header is not a table)")
    tensors = {key: info for key, info in table.items() if key != "__metadata__"}
    for key, info in tensors.items():
        if not isinstance(info, dict) or info.get("dtype") not in SAFETENSORS_DTYPES:
            raise NotSafetensors(f"{path.name} is not a safetensors file (tensor {key!r} has no known dtype)")
    return tensors


def _shape(tensors: dict[str, dict[str, Any]], *keys: str) -> list[int] | None:
    return next((list(tensors[key].get("shape", [])) for key in keys if key in tensors), None)


def _has_prefix(tensors: dict[str, Any], prefix: str) -> bool:
    return any(key.startswith(prefix) for key in tensors)


def checkpoint_pipeline(tensors: dict[str, dict[str, Any]]) -> str | None:
    """The diffusers pipeline a single-file checkpoint's keys make, by class name, or None
    where they are no whole model diffq knows (a LoRA, a bare VAE, a text encoder).

    An image-conditioned variant is named as such (an inpainting UNet takes 9 input channels,
    FLUX Fill 384 and Depth 128), so :func:`common.families.refusal` says why it does not run."""
    unet_in = _shape(tensors, "model.diffusion_model.input_blocks.0.0.weight")
    inpaint = unet_in is not None and len(unet_in) > 1 and unet_in[1] == 9
    if _has_prefix(tensors, "conditioner.embedders.1.model."):  # SDXL base: CLIP-L and OpenCLIP bigG
        return "StableDiffusionXLInpaintPipeline" if inpaint else "StableDiffusionXLPipeline"
    if _has_prefix(tensors, "conditioner.embedders.0.model."):  # the refiner: OpenCLIP bigG alone
        return "StableDiffusionXLImg2ImgPipeline"
    if unet_in is not None and (
        _has_prefix(tensors, "cond_stage_model.transformer.") or _has_prefix(tensors, "cond_stage_model.model.")
    ):  # SD 1.x (CLIP-L) and 2.x (OpenCLIP-H)
        return "StableDiffusionInpaintPipeline" if inpaint else "StableDiffusionPipeline"
    for prefix in ("", "model.diffusion_model."):
        if f"{prefix}joint_blocks.0.context_block.adaLN_modulation.1.bias" in tensors:
            return "StableDiffusion3Pipeline"
        if f"{prefix}double_blocks.0.img_attn.norm.key_norm.scale" in tensors:
            img_in = _shape(tensors, f"{prefix}img_in.weight")
            channels = img_in[1] if img_in is not None and len(img_in) > 1 else 64
            return {384: "FluxFillPipeline", 128: "FluxControlPipeline"}.get(channels, "FluxPipeline")
    return None


class Unrunnable(ValueError):
    """Why a file is no model diffq runs, worded to follow its name (``--model 'x.safetensors'``)."""


def runnable_pipeline(path: Path) -> str:
    """The pipeline class of the single-file checkpoint at ``path``, one that a family runs, or
    :class:`Unrunnable`: the producer's check at enqueue and the worker's load ask the same."""
    try:
        name = checkpoint_pipeline(header(path))
    except NotSafetensors as exc:
        raise Unrunnable(f": {exc}") from None
    if name is None:
        raise Unrunnable(
            " is a safetensors file but no whole model diffq knows (an adapter goes in --adapter; "
            "single files of SDXL, SD 1.x/2.x, SD3 and FLUX load): give a model folder, preset or hub id"
        )
    if not runs_here(name):
        raise Unrunnable(f" {refusal(name)}")
    return name


def single_file(name: str) -> Path | None:
    """``name`` as a single-file checkpoint's path, or None where it names something else
    (a preset, a folder, a hub id)."""
    path = Path(name).expanduser()
    return path if path.suffix in (*SINGLE_FILE_SUFFIXES, ".ckpt", ".pt", ".bin") and path.is_file() else None


def config_folder(checkpoint: Path) -> Path | None:
    """The diffusers folder whose configs a single file is loaded with (its tokenizers,
    scheduler and component configs: the file holds weights only): the checkpoint's own folder
    where it holds a ``model_index.json``, else None (diffusers then fetches the configs of the
    base model it recognises from the Hub, a few kilobytes)."""
    folder = checkpoint.parent
    return folder if (folder / "model_index.json").is_file() else None
