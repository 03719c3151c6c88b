"""Item keys and derived seeds are the identity of every image ever made: the fast hand-written
JSON must give the very bytes json.dumps gives, or a re-run would make everything again."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random

from common.jobspec import GenParams, PromptItem
from common.naming import KEY_CHARS, derived_seed, item_key

TRICKY = ['"', "\\", "\n", "\t", "\x01", "\x1f", "\u2028", "é", "富士山", "🦊", "a,b", "{}", "null", " ", "\x7f"]


def reference_digest(payload: dict) -> str:
    """How keys were made before the fast path (and must stay)."""
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def text(rng: random.Random) -> str:
    return "".join(rng.choice([*TRICKY, "x", "y", "prompt "]) for _ in range(rng.randrange(0, 12)))


def test_item_keys_and_seeds_are_the_json_digests_they_always_were():
    rng = random.Random(7)
    for _ in range(3000):
        adapter = rng.choice([None, "tiny-dora", "/a/b c.safetensors", text(rng) or "x"])
        params = GenParams(
            model=rng.choice(["tiny", "org/name", "stabilityai/stable-diffusion-xl-base-1.0"]),
            width=rng.choice([64, 1024]),
            height=rng.choice([64, 832]),
            steps=rng.randrange(1, 80),
            guidance=rng.choice([0.0, 5.0, 7.5, 1e-7, 12.25]),
            adapter=adapter,
            adapter_scale=rng.choice([1.0, 0.5, 0.1 + 0.2]),
        )
        row_id = rng.choice([None, text(rng)])
        prompt, negative = text(rng) or "p", text(rng)
        item = PromptItem(
            prompt=prompt, negative_prompt=negative, seed=rng.randrange(0, 2**63), num_images=2, id=row_id
        )
        expected = reference_digest({
            "model": params.model, "adapter": params.adapter,
            "adapter_scale": float(params.adapter_scale) if params.adapter else None,
            "width": params.width, "height": params.height, "steps": params.steps, "guidance": float(params.guidance),
            "prompt": prompt, "negative_prompt": negative, "seed": item.seed, "num_images": 2, "id": row_id,
        })[:KEY_CHARS]  # fmt: skip
        assert item_key(params, item) == expected
        seed = reference_digest({"seed": 1, "prompt": prompt, "negative_prompt": negative, "id": row_id})
        assert derived_seed(prompt, negative, row_id) == int(seed[:8], 16)


def test_a_known_key_never_changes():
    params = GenParams(model="tiny", width=64, height=64, steps=3)
    item = PromptItem(prompt="a red fox in snow", seed=derived_seed("a red fox in snow"))
    assert (item.seed, item_key(params, item)) == (682796420, "9d87be02447507abd550232f")


def test_a_parameter_added_later_leaves_every_existing_key_as_it_was():
    """A new generation parameter (a scheduler, say) with its default keeps old items' keys, so a
    campaign resumed after the upgrade redoes nothing; set to anything else it is new work."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class WithScheduler(GenParams):
        scheduler: str = "euler"

    item = PromptItem(prompt="a red fox in snow", seed=derived_seed("a red fox in snow"))
    old = item_key(GenParams(model="tiny", width=64, height=64, steps=3), item)
    assert old == "9d87be02447507abd550232f"
    assert item_key(WithScheduler(model="tiny", width=64, height=64, steps=3), item) == old
    changed = item_key(WithScheduler(model="tiny", width=64, height=64, steps=3, scheduler="dpm++"), item)
    assert changed != old and len(changed) == KEY_CHARS
