"""Reward scores of a batch's images, computed on the worker's device before they are written.

A scorer is a CLIP model (transformers' ``CLIPModel`` and ``CLIPProcessor``, from a hub id, a
folder or the ``tiny-clip`` preset): ``clip`` is 100 × the cosine of the image's and the
prompt's embeddings, 0 at worst (torchmetrics' CLIPScore); ``pickscore`` the model's logit
scale × that cosine (PickScore's reward); ``aesthetic`` a linear head
(``aesthetic_head.safetensors``: ``weight`` [1, D], ``bias`` [1]) over the normalised image
embedding. The images scored are the PIL images the worker writes, so a score describes the
bytes on disk. A batch is resized once for the scorers that share a processor and embedded once
per model, and its text always has the model's full length, so a job's shapes never change.

A scorer that cannot load is the worker's environment, not the job's: it is said once, left out
for the rest of this worker's life (the images are still made, their lines carry the scores
that did load), and kept for ``producer status`` beside the models that did not load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from PIL import Image

log = logging.getLogger("diffq.worker")

HEAD_FILE = "aesthetic_head.safetensors"
TINY_CLIP_SEED = 20261202


class Scorers:
    """The scorers this worker has loaded, by model, and those that would not load."""

    def __init__(self, device: Any, cache_dir: str) -> None:
        self.device = torch.device(device) if not isinstance(device, torch.device) else device
        self.cache_dir = cache_dir
        self._models: dict[str, tuple[Any, Any]] = {}
        self._heads: dict[str, torch.nn.Linear] = {}
        #: spec -> why it did not load (left out from then on)
        self.broken: dict[str, str] = {}
        #: what one :meth:`score` call has computed of its batch (pixels by processor settings,
        #: embeddings by model), so scorers sharing a processor or a model share the work
        self._batch: dict[tuple[str, str], torch.Tensor] = {}

    @torch.inference_mode()
    def score(
        self, specs: tuple[str, ...], images: list[Image.Image], prompts: list[str],
        on_broken: Callable[[str, str], None] | None = None,
    ) -> list[dict[str, float]]:  # fmt: skip
        """Each image's scores by name; a scorer that does not load is left out (``on_broken``
        hears it the first time, with why)."""
        found: list[dict[str, float]] = [{} for _ in images]
        try:
            self._score(specs, images, prompts, found, on_broken)
        finally:
            self._batch.clear()
        return found

    def _score(
        self, specs: tuple[str, ...], images: list[Image.Image], prompts: list[str], found: list[dict[str, float]],
        on_broken: Callable[[str, str], None] | None,
    ) -> None:  # fmt: skip
        for spec in specs:
            if spec in self.broken or not images:
                continue
            name, _, model = spec.partition("=")
            try:
                values = self._one(name, model, images, prompts)
            except Exception as exc:  # a hub id not there, a folder without a head, no memory
                why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
                self.broken[spec] = why
                log.error("scorer %s cannot score on this worker (%s); its images are made without it", spec, why)
                if on_broken is not None:
                    on_broken(spec, why)
                continue
            for record, value in zip(found, values, strict=True):
                record[name] = round(value, 4)

    def _one(self, name: str, model: str, images: list[Image.Image], prompts: list[str]) -> list[float]:
        clip, processor = self._load(model)
        return self._forward(name, model, clip, processor, images, prompts)

    def _forward(
        self, name: str, model: str, clip: Any, processor: Any, images: list[Image.Image], prompts: list[str]
    ) -> list[float]:  # fmt: skip
        def image_features() -> torch.Tensor:
            settings = processor.image_processor.to_json_string()
            pixels = self._once(("pixels", settings), lambda: _pixels(processor, images, self.device))
            return _unit(clip.get_image_features(pixel_values=pixels.to(clip.dtype)))

        image = self._once(("image", model), image_features)
        if name == "aesthetic":
            head = self._head(model, image.shape[-1])
            return head(image.float()).squeeze(-1).tolist()
        text = self._once(("text", model), lambda: _unit(_text_features(clip, processor, prompts, self.device)))
        cosine = (image.float() * text.float()).sum(dim=-1)
        if name == "pickscore":
            return (clip.logit_scale.exp().float() * cosine).tolist()
        return (100 * cosine.clamp(min=0)).tolist()

    def _once(self, key: tuple[str, str], make: Callable[[], torch.Tensor]) -> torch.Tensor:
        if key not in self._batch:
            self._batch[key] = make()
        return self._batch[key]

    def _load(self, model: str) -> tuple[Any, Any]:
        if model not in self._models:
            from transformers import CLIPModel, CLIPProcessor

            dtype = torch.float16 if self.device.type == "cuda" else torch.float32
            if model in RANDOM_CLIPS:
                self._models[model] = random_clip(RANDOM_CLIPS[model], self.device, dtype)
            else:
                source = ensure_tiny_clip(self.cache_dir) if model == "tiny-clip" else model
                clip = CLIPModel.from_pretrained(source, dtype=dtype).to(self.device).eval()
                self._models[model] = (clip, CLIPProcessor.from_pretrained(source))
            log.info("scorer model %s loaded", model)
        return self._models[model]

    def _head(self, model: str, width: int) -> torch.nn.Linear:
        if model not in self._heads:
            from huggingface_hub import hf_hub_download
            from safetensors.torch import load_file

            folder = ensure_tiny_clip(self.cache_dir) if model == "tiny-clip" else Path(model)
            path = folder / HEAD_FILE if folder.is_dir() else Path(hf_hub_download(model, HEAD_FILE))
            weights = load_file(str(path))
            head = torch.nn.Linear(width, 1).to(self.device)
            head.load_state_dict({"weight": weights["weight"].float(), "bias": weights["bias"].float()})
            self._heads[model] = head.eval()
        return self._heads[model]


def _pixels(processor: Any, images: list[Image.Image], device: torch.device) -> torch.Tensor:
    """The batch resized and normalised as ``processor`` does it (clip's and PickScore's
    processors both take 224-pixel crops, so two scorers share one pass)."""
    return processor.image_processor([i.convert("RGB") for i in images], return_tensors="pt")["pixel_values"].to(device)


def _text_features(clip: Any, processor: Any, prompts: list[str], device: torch.device) -> torch.Tensor:
    """The prompts' embeddings, every batch at the model's full text length: a shape that follows
    the longest prompt makes the attention kernels plan again for each new length; the padding is
    masked and after the end token, so the embedding is the same."""
    length = clip.config.text_config.max_position_embeddings
    text = processor.tokenizer(prompts, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
    return _tensor(
        clip.get_text_features(input_ids=text["input_ids"].to(device), attention_mask=text["attention_mask"].to(device))
    )


def _unit(out: Any) -> torch.Tensor:
    vector = _tensor(out)
    return vector / vector.norm(dim=-1, keepdim=True)


def _tensor(out: Any) -> torch.Tensor:
    """transformers 5 may hand back an output object where 4 gave the pooled tensor."""
    if isinstance(out, torch.Tensor):
        return out
    return out.pooler_output if getattr(out, "pooler_output", None) is not None else out[0]


#: the scorers' real architectures with random weights (the benchmarks' cost of a score):
#: CLIP ViT-L/14 (openai/clip-vit-large-patch14, ``clip``'s) and ViT-H/14 (PickScore's)
RANDOM_CLIPS: dict[str, dict[str, Any]] = {
    "clip-l-random": {
        "text": {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12},
        "vision": {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
                   "patch_size": 14},
        "projection_dim": 768,
    },
    "clip-h-random": {
        "text": {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24},
        "vision": {"hidden_size": 1280, "intermediate_size": 5120, "num_attention_heads": 16, "num_hidden_layers": 32,
                   "patch_size": 14},
        "projection_dim": 1024,
    },
}  # fmt: skip


def random_clip(shape: dict[str, Any], device: torch.device, dtype: torch.dtype) -> tuple[Any, Any]:
    """A CLIP of ``shape`` with random weights drawn on ``device`` and its processor (224-pixel
    images, the byte-level tokenizer): the FLOPs and the preprocessing of the real scorer."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    from worker.pipelines import models

    tokenizer = models.byte_tokenizer(49408)
    text = {**shape["text"], **models.clip_ids(tokenizer), "projection_dim": shape["projection_dim"]}
    vision = {**shape["vision"], "image_size": 224, "projection_dim": shape["projection_dim"]}
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=shape["projection_dim"])
    with models.drawn(TINY_CLIP_SEED, dtype, device):
        clip = CLIPModel(config).eval()
    images = CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224})
    return clip, CLIPProcessor(image_processor=images, tokenizer=tokenizer)


def ensure_tiny_clip(cache_dir: str | Path) -> Path:
    """``tiny-clip``: a CLIP of toy widths with random weights, its processor (the byte-level
    tokenizer ``tiny`` uses, 32-pixel images) and an aesthetic head, written once to the cache."""
    from safetensors.torch import save_file
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    from worker.pipelines import models

    def write(folder: Path) -> None:
        tokenizer = models.byte_tokenizer()
        ids = models.clip_ids(tokenizer)
        text = {**models.TINY_TEXT, **ids}
        vision = {"hidden_size": 32, "intermediate_size": 37, "num_attention_heads": 4, "num_hidden_layers": 2,
                  "image_size": 32, "patch_size": 8, "projection_dim": 32}  # fmt: skip
        torch.manual_seed(TINY_CLIP_SEED)
        clip = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=32)).eval()
        clip.save_pretrained(folder)
        images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(folder)
        save_file({"weight": torch.randn(1, 32), "bias": torch.tensor([5.0])}, str(folder / HEAD_FILE))

    return models.write_once(Path(cache_dir) / "scorers" / "tiny-clip", write)
