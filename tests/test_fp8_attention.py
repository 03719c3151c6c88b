"""The FP8 attention kernel that bench/fp8_attention.py measures (and the worker does not take):
run by Triton's interpreter on the CPU against ``F.scaled_dot_product_attention``, so the figures
in docs/benchmarks.md come from a kernel that computes attention."""

from __future__ import annotations

import pytest
from conftest import interpreted

# (batch, query tokens, key tokens, heads, head_dim): token counts that are not a multiple of the
# interpreter's 16-wide blocks (the masked tails), more keys than queries, one head
SHAPES = [(2, 37, 37, 3, 16), (1, 20, 45, 2, 32), (2, 32, 32, 1, 16)]

INTERPRETED = """
import json, sys
import torch
import torch.nn.functional as F
sys.path.insert(0, "bench")
import fp8_attention as fa

failures = []
for batch, sq, sk, heads, d in json.loads(sys.argv[1]):
    torch.manual_seed(0)
    q, k, v = torch.randn(batch, sq, heads * d), torch.randn(batch, sk, heads * d), torch.randn(batch, sk, heads * d)
    v_t = v.reshape(batch, sk, heads, d).permute(0, 2, 3, 1).contiguous()
    scale = torch.tensor(fa.scales(0.5, 0.25, 2.0, d, fp8=False))

    def per_head(t, s):
        return (t * s).reshape(batch, -1, heads, d).transpose(1, 2)

    want = F.scaled_dot_product_attention(per_head(q, 0.5), per_head(k, 0.25), per_head(v, 2.0))
    want = want.transpose(1, 2).reshape(batch, sq, heads * d)
    for name, got in (("kernel", fa.attention(q, k, v_t, scale, heads, torch.float32)),
                      ("reference", fa.reference(q, k, v_t, scale, heads, torch.float32))):
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
            failures.append(f"{name} {(batch, sq, sk, heads, d)}: off by {float((got - want).abs().max())}")
print(json.dumps(failures))
"""


def test_the_fp8_attention_kernel_computes_softmax_attention_with_its_scales():
    pytest.importorskip("triton", reason="triton is in the dev install (pyproject.toml)")
    assert interpreted(INTERPRETED, SHAPES) == []
