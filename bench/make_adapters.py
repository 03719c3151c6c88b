"""Two SDXL-sized adapters with random weights for the adapter-switching benchmark: a LoRA and a
DoRA of rank 32 on the UNet's attention projections (what community SDXL LoRAs usually
target), saved in the diffusers LoRA format that ``load_lora_weights`` reads.

    python3 bench/make_adapters.py /tmp/adapters   # writes /tmp/adapters/lora, /tmp/adapters/dora
    python3 bench/make_adapters.py /tmp/strong 3e-2   # adapters that change the image more
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from worker.pipelines.models import SDXL_UNET  # noqa: E402

TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
RANK = 32


def main() -> None:
    from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    out = Path(sys.argv[1])
    std = float(sys.argv[2]) if len(sys.argv) > 2 else 1e-3  # lora_B's spread: how much an adapter changes
    for name, dora in (("lora", False), ("dora", True)):
        torch.manual_seed(1 if dora else 0)
        unet = UNet2DConditionModel.from_config(SDXL_UNET).to("cuda" if torch.cuda.is_available() else "cpu")
        config = LoraConfig(
            r=RANK, lora_alpha=RANK, target_modules=TARGETS, use_dora=dora, init_lora_weights="gaussian"
        )
        unet.add_adapter(config)
        with torch.no_grad():
            for key, param in unet.named_parameters():
                if "lora_B" in key:
                    param.normal_(0.0, std)  # small but not zero: the adapter changes the image
        layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(unet))
        StableDiffusionXLPipeline.save_lora_weights(out / name, unet_lora_layers=layers)
        size = sum(p.numel() for p in layers.values())
        print(f"{name}: {len(layers)} tensors, {size / 1e6:.1f} M parameters -> {out / name}", flush=True)


if __name__ == "__main__":
    main()
