"""PixArt-Σ and PixArt-α: a DiT over SDXL's 4-channel latents, one T5-XXL text encoder (300
tokens), CFG as a second half of the batch, DPM-Solver by default. Images are made at the size
asked (``use_resolution_binning`` off: the pipeline otherwise renders at the nearest of its
aspect-ratio bins and resizes) and captions are taken as written (``clean_caption`` off: it
needs BeautifulSoup and ftfy, and would make the same row give other images on another host).

Its presets: ``pixart-random``, the PixArt-Σ-XL 1024 architecture (0.6 B DiT of 28 blocks, T5-XXL)
with random weights, for benchmarks; ``tiny-pixart`` at toy widths, written to disk, for tests."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch

from common.presets import AUTO_SPEEDUPS
from worker.pipelines import models
from worker.pipelines.families import Family
from worker.pipelines.families.generic import call

SIGMA_XL: dict[str, Any] = {
    "num_attention_heads": 16,
    "attention_head_dim": 72,
    "in_channels": 4,
    "out_channels": 8,
    "num_layers": 28,
    "cross_attention_dim": 1152,
    "caption_channels": 4096,
    "sample_size": 128,
    "patch_size": 2,
    "attention_bias": True,
    "activation_fn": "gelu-approximate",
    "num_embeds_ada_norm": 1000,
    "norm_type": "ada_norm_single",
    "norm_elementwise_affine": False,
    "norm_eps": 1e-6,
    "interpolation_scale": 2,
    "use_additional_conditions": False,
}
TINY_TRANSFORMER: dict[str, Any] = SIGMA_XL | {
    "num_attention_heads": 2,
    "attention_head_dim": 8,
    "num_layers": 2,
    "cross_attention_dim": 16,
    "caption_channels": 32,
    "sample_size": 32,
    "interpolation_scale": 1,
}
TINY_T5: dict[str, Any] = {"d_model": 32, "d_ff": 37, "d_kv": 8, "num_layers": 2, "num_heads": 4}
SCHEDULER: dict[str, Any] = {
    "beta_start": 0.0001,
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "prediction_type": "epsilon",
    "solver_order": 2,
}


#: the pipeline's own call, at the size asked and with captions as written (the module docstring)
run = partial(call, use_resolution_binning=False, clean_caption=False)


def build(
    transformer: dict[str, Any],
    vae: dict[str, Any],
    t5: dict[str, Any],
    *,
    t5_vocab: int | None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Any:
    """A PixArt-Σ pipeline of the given architecture with random weights, drawn on ``device`` in ``dtype``."""
    from diffusers import AutoencoderKL, DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    tokenizer = models.byte_tokenizer(t5_vocab)
    tokenizer.model_max_length = 300
    t5_ids = {"vocab_size": len(tokenizer), "pad_token_id": tokenizer.pad_token_id, "decoder_start_token_id": 0}
    with models.drawn(models.TINY_SEED, dtype, device):
        parts = {
            "transformer": PixArtTransformer2DModel(**transformer),
            "vae": AutoencoderKL(**vae),
            "text_encoder": T5EncoderModel(T5Config(**t5, **t5_ids)),
        }
    return PixArtSigmaPipeline(
        **{name: module.eval() for name, module in parts.items()},
        tokenizer=tokenizer,
        scheduler=DPMSolverMultistepScheduler(**SCHEDULER),
    )


def ensure_tiny(cache_dir: str | Path) -> Path:
    """``tiny-pixart``'s folder in the standard diffusers layout, written on first use."""

    def write(folder: Path) -> None:
        models.save_whole(build(TINY_TRANSFORMER, models.TINY_VAE, TINY_T5, t5_vocab=None), folder)

    return models.write_once(Path(cache_dir) / "models" / "tiny-pixart", write)


def _random(device: torch.device, dtype: torch.dtype, _cache_dir: str) -> Any:
    """bf16 on a GPU, as ``flux-random``: T5-XXL's random activations overflow fp16."""
    dtype = torch.bfloat16 if device.type == "cuda" else dtype
    return build(SIGMA_XL, models.SDXL_VAE, models.FLUX_T5, t5_vocab=models.FLUX_T5_VOCAB, device=device, dtype=dtype)


FAMILY = Family(
    title="PixArt",
    pipelines=("PixArtSigmaPipeline", "PixArtAlphaPipeline"),
    run=run,
    levers=frozenset({"vae-fp16", "compile-blocks", "compile-vae", "fp8", "fuse-qkv"}),
    auto=AUTO_SPEEDUPS["pixart"],
    blocks=("BasicTransformerBlock",),
    presets={"tiny-pixart": lambda _device, _dtype, cache_dir: ensure_tiny(cache_dir), "pixart-random": _random},
)
