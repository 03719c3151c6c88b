"""Model presets: names a job can use in place of a hub id or a folder.

These are plain data so the producer can print and check them without importing torch;
``worker/models.py`` knows how to build each one.
"""

from __future__ import annotations

DEFAULT_MODEL = "stabilityai/stable-diffusion-xl-base-1.0"

#: Built-in models. ``tiny`` is written once to the cache folder and then loaded with
#: ``from_pretrained`` like any model; ``sdxl-random`` is built in memory on the device.
MODEL_PRESETS: dict[str, str] = {
    "tiny": "small SDXL-architecture pipeline with random weights (CPU tests and the demo)",
    "sdxl-random": "full SDXL-base architecture with random weights (GPU benchmarks; same FLOPs)",
    "flux-random": "FLUX.1-dev architecture (12 B DiT, T5-XXL) with random weights (xDiT group benchmarks)",
}

#: Built-in adapters, resolved by the worker to a folder in its cache.
ADAPTER_PRESETS: dict[str, str] = {
    "tiny-dora": "a DoRA adapter (peft, use_dora=True) with random weights for the tiny model",
}
