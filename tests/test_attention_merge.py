"""The ring's last merge (worker/group/attention_merge.py): the Triton kernel, run by Triton's
interpreter on the CPU, makes the attention over every key from two attentions over half of them
each, in the model's layout; and the compiler keeps the op whole. Its speed in the ring on GPUs
is measured by ``bash bench/group_device.sh fluxmerge`` (docs/groups.md)."""

from __future__ import annotations

import pytest
import torch
from conftest import interpreted

from worker.group import attention_merge

# (batch, heads, query tokens, key tokens per half, dim): token counts that are not a multiple of
# the kernel's 64-token blocks, a dim that is not a power of two (the masked tail) and FLUX's 128
SHAPES = [(1, 3, 70, 50, 16), (2, 2, 130, 64, 128), (1, 4, 9, 200, 24)]

# the interpreter runs each program of the kernel with numpy: a wrong address or weight is a
# wrong number here. It must be on before Triton is first imported: a child process runs it.
INTERPRETED = """
import json, sys
import torch
from worker.group import attention_merge

def attend(q, k, v):
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.softmax(scores, -1) @ v, torch.logsumexp(scores, -1)

failures = []
for batch, heads, tokens, keys, dim in json.loads(sys.argv[1]):
    torch.manual_seed(0)
    q = torch.randn(batch, heads, tokens, dim, dtype=torch.float64)
    k = torch.randn(batch, heads, 2 * keys, dim, dtype=torch.float64) * 2
    v = torch.randn(batch, heads, 2 * keys, dim, dtype=torch.float64)
    whole, _ = attend(q, k, v)
    want = whole.transpose(1, 2).float()
    (a, lse_a), (b, lse_b) = attend(q, k[:, :, :keys], v[:, :, :keys]), attend(q, k[:, :, keys:], v[:, :, keys:])
    # fp32 halves with a [b, h, t] and a [b, h, t, 1] log-sum-exp; the first half a strided view
    a32 = a.float().transpose(2, 3).contiguous().transpose(2, 3)
    # (inputs, tolerance against the whole attention, relative tolerance against the reference:
    # one unit in the last place of the output's dtype, as the two may round the same fp32 apart)
    cases = {
        "fp32": (a32, lse_a.float(), b.float(), lse_b.float().unsqueeze(-1), 1e-5, 1e-6),
        "bf16": (a.bfloat16(), lse_a.float(), b.bfloat16(), lse_b.float(), 2e-2, 2 ** -7),
        "fp32 then bf16": (a.float(), lse_a.float(), b.bfloat16(), lse_b.float(), 2e-2, 2 ** -7),
    }
    for name, (out, lse, other, other_lse, tol, ulp) in cases.items():
        case = f"{(batch, heads, tokens, keys, dim)} {name}"
        got = attention_merge.merge(out, lse, other, other_lse)
        ref = attention_merge.reference(out, lse, other, other_lse)
        if got.shape != (batch, tokens, heads, dim) or not got.is_contiguous() or got.dtype != other.dtype:
            failures.append(f"{case}: {tuple(got.shape)} {got.stride()} {got.dtype}")
        elif not torch.allclose(got.float(), want, atol=tol, rtol=tol):
            failures.append(f"{case}: off the whole attention by {float((got.float() - want).abs().max())}")
        elif not torch.allclose(got.float(), ref.float(), atol=1e-6, rtol=ulp):
            failures.append(f"{case}: off the reference by {float((got.float() - ref.float()).abs().max())}")
print(json.dumps(failures))
"""


def test_the_kernel_makes_the_whole_attention_from_two_halves_in_tokens_first_layout() -> None:
    assert interpreted(INTERPRETED, SHAPES) == []


@pytest.mark.slow  # a compile under Triton's interpreter: 20-25 s on 2 cores
@pytest.mark.long
def test_the_compiler_keeps_the_merge_one_op() -> None:
    """Under ``torch.compile`` the merge stays its own call (what lets the kernel after the
    attention be one GPU's), with the same result as eager."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    out, other = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    lse, other_lse = torch.randn(1, 2, 8), torch.randn(1, 2, 8)

    def after_attention(out, lse, other, other_lse, mlp):
        merged = attention_merge.merge_attention(out, lse, other, other_lse).flatten(2, 3)
        return torch.cat([merged, torch.nn.functional.gelu(mlp)], dim=2)

    mlp = torch.randn(1, 8, 64)
    eager = after_attention(out, lse, other, other_lse, mlp)
    compiled_fn = torch.compile(after_attention, fullgraph=True)
    compiled, (code, *_) = run_and_get_code(compiled_fn, out, lse, other, other_lse, mlp)
    assert torch.allclose(compiled, eager, atol=1e-6)
    assert "torch.ops.diffq.merge_attention.default(" in code
