"""Building the preset models: ``tiny`` (written to disk, then loaded like any model),
``sdxl-random`` (full SDXL-base architecture, random weights, built on the device),
``flux-random`` (the FLUX.1-dev architecture, random weights: the DiT for xDiT groups) and the
``tiny-dora`` adapter.

Nothing here downloads anything. The tokenizer is a byte-level CLIP tokenizer we write
ourselves (every byte is a token), so the text path is real even without hub files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

SDXL_UNET: dict[str, Any] = {
    "sample_size": 128,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    "up_block_types": ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    "block_out_channels": (320, 640, 1280),
    "layers_per_block": 2,
    "cross_attention_dim": 2048,
    "transformer_layers_per_block": (1, 2, 10),
    "attention_head_dim": (5, 10, 20),
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816,
    "norm_num_groups": 32,
}
SDXL_VAE: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2,
    "latent_channels": 4,
    "sample_size": 1024,
    "scaling_factor": 0.13025,
    "force_upcast": True,
}
SDXL_TEXT: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "hidden_act": "quick_gelu",
    "projection_dim": 768,
}
SDXL_TEXT_2: dict[str, Any] = {
    "hidden_size": 1280,
    "intermediate_size": 5120,
    "num_attention_heads": 20,
    "num_hidden_layers": 32,
    "hidden_act": "gelu",
    "projection_dim": 1280,
}
SDXL_VOCAB = 49408

# The tiny model keeps every SDXL feature (two text encoders, text_time conditioning,
# cross-attention blocks, a KL VAE) at toy widths: 64x64 images in well under a second on a CPU.
TINY_UNET: dict[str, Any] = {
    "sample_size": 32,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D"),
    "up_block_types": ("CrossAttnUpBlock2D", "UpBlock2D"),
    "block_out_channels": (32, 64),
    "layers_per_block": 2,
    "cross_attention_dim": 64,
    "transformer_layers_per_block": (1, 2),
    "attention_head_dim": (2, 4),
    "use_linear_projection": True,
    "addition_embed_type": "text_time",
    "addition_time_embed_dim": 8,
    "projection_class_embeddings_input_dim": 80,  # 2 x 8 (time ids) x 3 + 32 (pooled text)
    "norm_num_groups": 32,
}
TINY_VAE: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D",) * 2,
    "up_block_types": ("UpDecoderBlock2D",) * 2,
    "block_out_channels": (32, 64),
    "layers_per_block": 1,
    "latent_channels": 4,
    "sample_size": 128,
    "norm_num_groups": 32,
}
TINY_TEXT: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "hidden_act": "gelu",
    "projection_dim": 32,
}
SCHEDULER: dict[str, Any] = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "prediction_type": "epsilon",
}
TINY_SEED = 20261122
DORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible map from bytes to printable characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def byte_tokenizer(vocab_size: int | None = None):
    """A CLIP tokenizer whose vocabulary is every byte (with and without end-of-word),
    padded with unused tokens to ``vocab_size`` so embedding tables have their real size."""
    from transformers import CLIPTokenizer

    vocab: dict[str, int] = {}
    for ch in _bytes_to_unicode().values():
        vocab[ch] = len(vocab)
    for ch in _bytes_to_unicode().values():
        vocab[ch + "</w>"] = len(vocab)
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    while vocab_size and len(vocab) < vocab_size:
        vocab[f"<|unused{len(vocab)}|>"] = len(vocab)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.json").write_text(json.dumps(vocab))
        (Path(tmp) / "merges.txt").write_text("#version: 0.2\n")
        return CLIPTokenizer(
            str(Path(tmp) / "vocab.json"),
            str(Path(tmp) / "merges.txt"),
            pad_token="<|endoftext|>",
            model_max_length=77,
        )


def clip_ids(tokenizer: Any) -> dict[str, int]:
    """What a CLIP text encoder's config takes from its tokenizer (SDXL's two, FLUX's first)."""
    return {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "max_position_embeddings": 77,
    }


@contextmanager
def drawn(seed: int, dtype: torch.dtype, device: str | torch.device) -> Iterator[None]:
    """Modules made in the body draw their random weights from ``seed``, in ``dtype``, on
    ``device``: where they will run (no CPU copy to move) and reproducibly."""
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(default)


def build_sdxl(
    unet: dict[str, Any],
    vae: dict[str, Any],
    text: dict[str, Any],
    text_2: dict[str, Any],
    *,
    vocab_size: int | None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = TINY_SEED,
    build_dtype: torch.dtype = torch.float32,
):
    """An SDXL pipeline of the given architecture with random weights, built on ``device``.

    The weights are drawn in ``build_dtype`` and cast to ``dtype``: drawn in fp32, an fp16 and a
    bf16 pipeline hold the same model (what the benchmarks compare), but SDXL then takes 12.6 GiB
    of the GPU while it is built, for a 6.5 GiB fp16 pipeline; drawn in ``dtype`` it fits the
    cap of an 8 or 12 GiB worker (``--gpu-memory``), with other random weights."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    tokenizer = byte_tokenizer(vocab_size)
    ids = clip_ids(tokenizer)
    with drawn(seed, build_dtype, device):
        parts = {
            "unet": UNet2DConditionModel(**unet),
            "vae": AutoencoderKL(**vae),
            "text_encoder": CLIPTextModel(CLIPTextConfig(**text, **ids)),
            "text_encoder_2": CLIPTextModelWithProjection(CLIPTextConfig(**text_2, **ids)),
        }
    parts = {name: module.to(dtype=dtype).eval() for name, module in parts.items()}
    return StableDiffusionXLPipeline(
        **parts,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        scheduler=EulerDiscreteScheduler(**SCHEDULER),
    )


def sdxl_random(device: str | torch.device, dtype: torch.dtype, *, drawn_in_dtype: bool = False):
    """Full SDXL-base architecture (2.57 B-parameter UNet) with random weights: real FLOPs, no download.
    ``drawn_in_dtype``: draw the weights in ``dtype`` rather than fp32 (half the memory to build)."""
    return build_sdxl(
        SDXL_UNET, SDXL_VAE, SDXL_TEXT, SDXL_TEXT_2, vocab_size=SDXL_VOCAB, device=device, dtype=dtype,
        build_dtype=dtype if drawn_in_dtype else torch.float32,
    )  # fmt: skip


# FLUX.1-dev: a 12 B-parameter MMDiT (19 double + 38 single blocks, 24 heads of 128), CLIP-L for
# the pooled text, T5-XXL (4.7 B) for the sequence, and a 16-channel VAE.
FLUX_TRANSFORMER: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": (16, 56, 56),
}
FLUX_VAE: dict[str, Any] = SDXL_VAE | {
    "latent_channels": 16,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
}
FLUX_CLIP: dict[str, Any] = SDXL_TEXT  # CLIP ViT-L/14, as SDXL's first text encoder
FLUX_T5: dict[str, Any] = {
    "d_model": 4096,
    "d_ff": 10240,
    "d_kv": 64,
    "num_layers": 24,
    "num_heads": 64,
    "feed_forward_proj": "gated-gelu",
    "relative_attention_num_buckets": 32,
}
FLUX_T5_VOCAB = 32128
FLUX_SCHEDULER: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
}


def build_flux(
    transformer: dict[str, Any],
    vae: dict[str, Any],
    clip: dict[str, Any],
    t5: dict[str, Any],
    *,
    t5_vocab: int | None,
    clip_vocab: int | None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = TINY_SEED,
):
    """A FLUX pipeline of the given architecture with random weights, built on ``device`` directly
    in ``dtype`` (the full model is 17 B parameters: building it in fp32 first would need 68 GB)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    clip_tokenizer = byte_tokenizer(clip_vocab)
    t5_tokenizer = byte_tokenizer(t5_vocab)
    t5_tokenizer.model_max_length = 512
    ids = clip_ids(clip_tokenizer)
    t5_ids = {"vocab_size": len(t5_tokenizer), "pad_token_id": t5_tokenizer.pad_token_id, "decoder_start_token_id": 0}
    with drawn(seed, dtype, device):
        parts = {
            "transformer": FluxTransformer2DModel(**transformer),
            "vae": AutoencoderKL(**vae),
            "text_encoder": CLIPTextModel(CLIPTextConfig(**clip, **ids)),
            "text_encoder_2": T5EncoderModel(T5Config(**t5, **t5_ids)),
        }
    parts = {name: module.eval() for name, module in parts.items()}
    return FluxPipeline(
        **parts,
        tokenizer=clip_tokenizer,
        tokenizer_2=t5_tokenizer,
        scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER),
    )


def flux_random(device: str | torch.device, dtype: torch.dtype):
    """The FLUX.1-dev architecture (12 B transformer, T5-XXL) with random weights: real FLOPs, no download."""
    return build_flux(
        FLUX_TRANSFORMER,
        FLUX_VAE,
        FLUX_CLIP,
        FLUX_T5,
        t5_vocab=FLUX_T5_VOCAB,
        clip_vocab=SDXL_VOCAB,
        device=device,
        dtype=dtype,
    )


def write_once(target: Path, write: Any) -> Path:
    """Write a folder atomically: build it beside ``target``, then rename. Safe if two workers race."""
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write(tmp)
        (tmp / ".complete").write_text("ok\n")
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / ".complete").exists():  # someone else's half-written folder: replace it
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_tiny(cache_dir: str | Path) -> Path:
    """The tiny model's folder in the standard diffusers layout, written on first use."""

    def write(folder: Path) -> None:
        save_whole(build_sdxl(TINY_UNET, TINY_VAE, TINY_TEXT, TINY_TEXT, vocab_size=None), folder)

    return write_once(Path(cache_dir) / "models" / "tiny", write)


def save_whole(pipe: Any, folder: Path) -> None:
    """``pipe.save_pretrained(folder)`` with every text encoder's weights written:
    transformers 5 writes them only on rank 0 of an initialised process group, but every rank of
    a group may write a tiny model's folder (and the first rename wins), so each writes it whole."""
    from transformers import PreTrainedModel

    for component in pipe.components.values():
        if isinstance(component, PreTrainedModel):
            component.should_save_on_this_rank = lambda is_main_process: True
    pipe.save_pretrained(folder)


def ensure_tiny_dora(cache_dir: str | Path) -> Path:
    """A DoRA adapter for the tiny UNet (peft ``use_dora=True``), saved as diffusers LoRA weights.

    Its weights are random (``init_lora_weights=False``), so unlike a freshly initialised
    adapter it visibly changes the image, which is what a test of adapter switching needs.
    """
    model_dir = ensure_tiny(cache_dir)

    def write(folder: Path) -> None:
        from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel
        from diffusers.utils import convert_state_dict_to_diffusers
        from peft import LoraConfig
        from peft.utils import get_peft_model_state_dict

        torch.manual_seed(TINY_SEED + 1)
        unet = UNet2DConditionModel.from_pretrained(model_dir / "unet")
        config = LoraConfig(r=4, lora_alpha=4, target_modules=DORA_TARGETS, use_dora=True, init_lora_weights=False)
        unet.add_adapter(config)
        layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(unet))
        StableDiffusionXLPipeline.save_lora_weights(folder, unet_lora_layers=layers)

    return write_once(Path(cache_dir) / "adapters" / "tiny-dora", write)
