"""A single-file export of the ``tiny`` model, the way fine-tuned SDXL checkpoints are shared.

One ``.safetensors`` holds the UNet, the VAE and both text encoders under the original
Stability (LDM) key names: ``model.diffusion_model.`` (UNet blocks as ``input_blocks.N.M``),
``first_stage_model.`` (the VAE as ``encoder.down.N.block.M``), ``conditioner.embedders.0.transformer.``
(CLIP-L, Hugging Face names) and ``conditioner.embedders.1.model.`` (OpenCLIP bigG:
``transformer.resblocks.N`` with q, k and v in one ``in_proj``). diffusers' loader converts
these back (``diffusers.loaders.single_file_utils``); a test that loads the file and gets the
folder model's pixels checks this writer and the loader together.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "norm2": "out_layers.0", "conv2": "out_layers.3",
          "time_emb_proj": "emb_layers.1", "conv_shortcut": "skip_connection"}  # fmt: skip
UNET_TOP = {"time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
            "add_embedding.linear_1": "label_emb.0.0", "add_embedding.linear_2": "label_emb.0.2",
            "conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2"}  # fmt: skip
VAE_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
OPENCLIP_TOP = {"text_model.embeddings.position_embedding.weight": "positional_embedding",
                "text_model.embeddings.token_embedding.weight": "token_embedding.weight",
                "text_model.final_layer_norm.weight": "ln_final.weight",
                "text_model.final_layer_norm.bias": "ln_final.bias"}  # fmt: skip
OPENCLIP_LAYER = {"layer_norm1": "ln_1", "layer_norm2": "ln_2", "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj",
                  "self_attn.out_proj": "attn.out_proj"}  # fmt: skip


def _renamed(rest: str, table: dict[str, str]) -> str:
    for ours, theirs in table.items():
        if rest.startswith(ours + "."):
            return theirs + rest[len(ours) :]
    return rest


def unet_key(key: str, layers: int, up_attention: list[bool]) -> str:
    """A diffusers UNet key's LDM name (``layers``: resnets per down block; an up block has one more)."""
    per = layers + 1
    if (top := _renamed(key, UNET_TOP)) != key:
        return top
    if m := re.fullmatch(r"down_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.+)", key):
        block, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
        inner = f"0.{_renamed(rest, RESNET)}" if kind == "resnets" else f"1.{rest}"
        return f"input_blocks.{1 + block * per + j}.{inner}"
    if m := re.fullmatch(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.+)", key):
        return f"input_blocks.{(int(m[1]) + 1) * per}.0.op.{m[2]}"
    if m := re.fullmatch(r"mid_block\.resnets\.(\d+)\.(.+)", key):
        return f"middle_block.{2 * int(m[1])}.{_renamed(m[2], RESNET)}"
    if m := re.fullmatch(r"mid_block\.attentions\.0\.(.+)", key):
        return f"middle_block.1.{m[1]}"
    if m := re.fullmatch(r"up_blocks\.(\d+)\.(resnets|attentions)\.(\d+)\.(.+)", key):
        block, kind, j, rest = int(m[1]), m[2], int(m[3]), m[4]
        inner = f"0.{_renamed(rest, RESNET)}" if kind == "resnets" else f"1.{rest}"
        return f"output_blocks.{block * per + j}.{inner}"
    if m := re.fullmatch(r"up_blocks\.(\d+)\.upsamplers\.0\.conv\.(.+)", key):
        block = int(m[1])
        return f"output_blocks.{block * per + layers}.{2 if up_attention[block] else 1}.conv.{m[2]}"
    raise KeyError(key)


def vae_key(key: str, blocks: int) -> str:
    """A diffusers VAE key's LDM name (``blocks``: its down or up blocks; up ones count down)."""
    for part in ("encoder", "decoder"):
        if key.startswith(f"{part}.conv_norm_out."):
            return f"{part}.norm_out." + key[len(f"{part}.conv_norm_out.") :]
    shortcut = {"conv_shortcut": "nin_shortcut"}
    if m := re.fullmatch(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.+)", key):
        return f"encoder.down.{m[1]}.block.{m[2]}.{_renamed(m[3], shortcut)}"
    if m := re.fullmatch(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.(.+)", key):
        return f"encoder.down.{m[1]}.downsample.{m[2]}"
    if m := re.fullmatch(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)", key):
        return f"decoder.up.{blocks - 1 - int(m[1])}.block.{m[2]}.{_renamed(m[3], shortcut)}"
    if m := re.fullmatch(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.+)", key):
        return f"decoder.up.{blocks - 1 - int(m[1])}.upsample.{m[2]}"
    if m := re.fullmatch(r"(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.+)", key):
        return f"{m[1]}.mid.block_{int(m[2]) + 1}.{_renamed(m[3], shortcut)}"
    if m := re.fullmatch(r"(encoder|decoder)\.mid_block\.attentions\.0\.(.+)", key):
        return f"{m[1]}.mid.attn_1.{_renamed(m[2], VAE_ATTENTION)}"
    return key  # conv_in, conv_out, quant_conv, post_quant_conv: the same names


def openclip(text: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A CLIPTextModelWithProjection's weights under OpenCLIP's names (q, k, v as one in_proj)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in text.items():
        if key in OPENCLIP_TOP:
            out[OPENCLIP_TOP[key]] = value
        elif key == "text_projection.weight":
            out["text_projection"] = value.T.contiguous()
        elif m := re.fullmatch(r"text_model\.encoder\.layers\.(\d+)\.self_attn\.q_proj\.(weight|bias)", key):
            base = f"text_model.encoder.layers.{m[1]}.self_attn"
            parts = [text[f"{base}.{p}_proj.{m[2]}"] for p in "qkv"]
            out[f"transformer.resblocks.{m[1]}.attn.in_proj_{m[2]}"] = torch.cat(parts)
        elif (m := re.fullmatch(r"text_model\.encoder\.layers\.(\d+)\.(.+)", key)) and not re.match(
            r"self_attn\.[kv]_proj\.", m[2]
        ):
            out[f"transformer.resblocks.{m[1]}.{_renamed(m[2], OPENCLIP_LAYER)}"] = value
    return out


def write_tiny_sdxl(folder: Path) -> Path:
    """A tiny SDXL folder whose two text encoders differ in width, as SDXL's do (768 and 1280):
    diffusers tells CLIP-L from OpenCLIP in a single file by that width, and ``tiny``'s two are
    both 32 wide."""
    from worker.pipelines import models

    text_2 = models.TINY_TEXT | {"hidden_size": 48}
    unet = models.TINY_UNET | {"cross_attention_dim": models.TINY_TEXT["hidden_size"] + text_2["hidden_size"]}
    pipe = models.build_sdxl(unet, models.TINY_VAE, models.TINY_TEXT, text_2, vocab_size=None)
    models.save_whole(pipe, folder)
    return folder


def write_single_file(model: Path, target: Path) -> Path:
    """``model``'s weights as one LDM-named ``target`` .safetensors, beside a copy of its configs
    (tokenizers, scheduler, component configs; no weights): the layout a user gets by putting
    a fine-tune's file in a folder of its base model's configs."""
    import json

    target.parent.mkdir(parents=True, exist_ok=True)
    unet_config = json.loads((model / "unet" / "config.json").read_text())
    vae_config = json.loads((model / "vae" / "config.json").read_text())
    up_attention = ["CrossAttn" in kind for kind in unet_config["up_block_types"]]
    tensors: dict[str, torch.Tensor] = {}
    for key, value in load_file(model / "unet" / "diffusion_pytorch_model.safetensors").items():
        tensors["model.diffusion_model." + unet_key(key, unet_config["layers_per_block"], up_attention)] = value
    for key, value in load_file(model / "vae" / "diffusion_pytorch_model.safetensors").items():
        ldm = vae_key(key, len(vae_config["up_block_types"]))
        if ".mid.attn_1." in ldm and ldm.endswith("weight") and value.ndim == 2:
            value = value[:, :, None, None]  # the LDM VAE's attention is 1x1 convolutions
        tensors["first_stage_model." + ldm] = value
    for key, value in load_file(model / "text_encoder" / "model.safetensors").items():
        # transformers 5 saves a CLIPTextModel without its ``text_model.`` prefix; checkpoints keep it
        wrapped = key if key.startswith("text_model.") else "text_model." + key
        tensors["conditioner.embedders.0.transformer." + wrapped] = value
    for key, value in openclip(load_file(model / "text_encoder_2" / "model.safetensors")).items():
        tensors["conditioner.embedders.1.model." + key] = value
    save_file({key: value.contiguous() for key, value in tensors.items()}, target)
    for item in model.iterdir():
        if item.is_dir():
            shutil.copytree(item, target.parent / item.name, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
        elif item.name == "model_index.json":
            shutil.copy2(item, target.parent / item.name)
    return target
