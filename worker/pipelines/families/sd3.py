"""Stable Diffusion 3 and 3.5 (large, medium, turbo): an MMDiT over 16-channel latents, two CLIP
text encoders for the pooled text and T5-XXL for the sequence, CFG as a second half of the batch,
a flow-matching scheduler (the noise-prediction samplers are refused per job).

Its presets: ``sd3-random``, the SD3.5-medium architecture (a 2.5 B MMDiT of 24 blocks, two of
its attentions dual from block 0 to 12, RMS-normed queries and keys) with random weights, for
benchmarks; ``tiny-sd3``, the same kinds of parts at toy widths, written to disk and loaded with
``from_pretrained`` like a downloaded model, for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from common.presets import AUTO_SPEEDUPS
from worker.pipelines import models
from worker.pipelines.families import Family
from worker.pipelines.families.generic import call

SD35_MEDIUM: dict[str, Any] = {
    "sample_size": 128,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 24,
    "attention_head_dim": 64,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1536,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "pos_embed_max_size": 384,
    "dual_attention_layers": tuple(range(13)),
    "qk_norm": "rms_norm",
}
SD3_VAE: dict[str, Any] = models.SDXL_VAE | {
    "latent_channels": 16,
    "scaling_factor": 1.5305,
    "shift_factor": 0.0609,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "force_upcast": False,
}
SD3_SCHEDULER: dict[str, Any] = {"num_train_timesteps": 1000, "shift": 3.0}

TINY_TRANSFORMER: dict[str, Any] = {
    "sample_size": 32,
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 2,
    "attention_head_dim": 8,
    "num_attention_heads": 4,
    "joint_attention_dim": 64,  # T5's width: SD3 pads the two CLIPs' 32 + 32 to it
    "caption_projection_dim": 32,
    "pooled_projection_dim": 64,
    "out_channels": 16,
    "pos_embed_max_size": 64,
    "dual_attention_layers": (0,),
    "qk_norm": "rms_norm",
}
TINY_VAE: dict[str, Any] = models.TINY_VAE | {
    "latent_channels": 16,
    "scaling_factor": 1.5305,
    "shift_factor": 0.0609,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}
TINY_T5: dict[str, Any] = {"d_model": 64, "d_ff": 37, "d_kv": 16, "num_layers": 2, "num_heads": 4}


def build(
    transformer: dict[str, Any],
    vae: dict[str, Any],
    clip: dict[str, Any],
    clip_2: dict[str, Any],
    t5: dict[str, Any],
    *,
    vocab_size: int | None,
    t5_vocab: int | None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Any:
    """An SD3 pipeline of the given architecture with random weights, drawn on ``device`` in ``dtype``."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    tokenizer, t5_tokenizer = models.byte_tokenizer(vocab_size), models.byte_tokenizer(t5_vocab)
    t5_tokenizer.model_max_length = 256
    ids = models.clip_ids(tokenizer)
    t5_ids = {"vocab_size": len(t5_tokenizer), "pad_token_id": t5_tokenizer.pad_token_id, "decoder_start_token_id": 0}
    with models.drawn(models.TINY_SEED, dtype, device):
        parts = {
            "transformer": SD3Transformer2DModel(**transformer),
            "vae": AutoencoderKL(**vae),
            "text_encoder": CLIPTextModelWithProjection(CLIPTextConfig(**clip, **ids)),
            "text_encoder_2": CLIPTextModelWithProjection(CLIPTextConfig(**clip_2, **ids)),
            "text_encoder_3": T5EncoderModel(T5Config(**t5, **t5_ids)),
        }
    return StableDiffusion3Pipeline(
        **{name: module.eval() for name, module in parts.items()},
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        tokenizer_3=t5_tokenizer,
        scheduler=FlowMatchEulerDiscreteScheduler(**SD3_SCHEDULER),
    )


def ensure_tiny(cache_dir: str | Path) -> Path:
    """``tiny-sd3``'s folder in the standard diffusers layout, written on first use."""

    def write(folder: Path) -> None:
        t = models.TINY_TEXT
        models.save_whole(build(TINY_TRANSFORMER, TINY_VAE, t, t, TINY_T5, vocab_size=None, t5_vocab=None), folder)

    return models.write_once(Path(cache_dir) / "models" / "tiny-sd3", write)


def _random(device: torch.device, dtype: torch.dtype, _cache_dir: str) -> Any:
    """bf16 on a GPU, as ``flux-random``: T5-XXL's random activations overflow fp16."""
    dtype = torch.bfloat16 if device.type == "cuda" else dtype
    return build(
        SD35_MEDIUM, SD3_VAE, models.SDXL_TEXT, models.SDXL_TEXT_2, models.FLUX_T5,
        vocab_size=models.SDXL_VOCAB, t5_vocab=models.FLUX_T5_VOCAB, device=device, dtype=dtype,
    )  # fmt: skip


FAMILY = Family(
    title="SD3",
    pipelines=("StableDiffusion3Pipeline",),
    run=call,
    levers=frozenset({"vae-fp16", "compile-blocks", "compile-vae", "fp8", "fuse-qkv"}),
    auto=AUTO_SPEEDUPS["sd3"],
    blocks=("SD3SingleTransformerBlock", "JointTransformerBlock"),
    presets={"tiny-sd3": lambda _device, _dtype, cache_dir: ensure_tiny(cache_dir), "sd3-random": _random},
)
