"""The FP8 convolution: the Triton implicit-GEMM kernel itself (run by Triton's interpreter on
the CPU, against ``F.conv2d`` on the same values), the op the compiler sees, and the layer
``--precision fp8`` puts in place of a 3x3 convolution. The kernel's speed and its runs on an
H100's FP8 tensor cores are measured by bench/fp8_conv.py (docs/benchmarks.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import interpreted

from worker.pipelines import fp8, fp8_conv

E4M3 = torch.float8_e4m3fn

# (batch, channels, height, width, out channels, kernel, stride, padding): padding on every edge,
# stride 2 (SDXL's downsamplers), odd sizes, channel counts that are not a multiple of the
# interpreter's 16-wide blocks (the masked tails), and a 1x1
SHAPES = [
    (2, 32, 9, 7, 48, 3, 1, 1),
    (1, 32, 8, 8, 16, 3, 2, 1),
    (2, 24, 5, 6, 36, 3, 1, 1),
    (3, 20, 5, 6, 40, 1, 1, 0),
]

# Triton's interpreter runs each program of the kernel on the CPU with numpy: the same indexing,
# masks and dot products the GPU runs, so a wrong address is a wrong number here. It must be
# switched on before Triton is first imported, which the test process has done: a child runs it.
INTERPRETED = """
import json, sys
import torch
import torch.nn.functional as F
from worker.pipelines import fp8_conv

failures = []
for batch, c, h, w, c_out, k, stride, pad in json.loads(sys.argv[1]):
    torch.manual_seed(0)
    x = torch.randn(batch, c, h, w).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(c_out, c, k, k), torch.randn(c_out)
    matrix = fp8_conv.weight_matrix(weight)
    want = F.conv2d(x, weight, stride=stride, padding=pad) * 0.5 + bias.reshape(1, -1, 1, 1)
    # the output in either layout; the second time from an NCHW input (copied to channels-last)
    for source, channels_last in ((x, True), (x.contiguous(), False)):
        half = torch.tensor([0.5])
        got = fp8_conv.conv2d(source, matrix, half, bias, (k, k), stride, pad, torch.float32, channels_last)
        case = f"{(batch, c, h, w, c_out, k, stride, pad)} channels_last_out={channels_last}"
        layout = torch.channels_last if channels_last else torch.contiguous_format
        if got.shape != want.shape or not got.is_contiguous(memory_format=layout):
            failures.append(f"{case}: {tuple(got.shape)} {got.stride()}")
        elif not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            failures.append(f"{case}: off by {float((got - want).abs().max())}")

# FP8 values, no bias: the reference the CPU's layer runs computes the same
x = torch.randn(2, 32, 6, 6).to(torch.float8_e4m3fn)
weight = fp8_conv.weight_matrix(torch.randn(32, 32, 3, 3)).to(torch.float8_e4m3fn)
scale = torch.tensor([0.25])
got = fp8_conv.conv2d(x, weight, scale, None, (3, 3), 1, 1, torch.float32)
want = fp8_conv.reference(x, weight, scale, None, (3, 3), 1, 1, torch.float32)
if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
    failures.append(f"fp8 without bias: off by {float((got - want).abs().max())}")
print(json.dumps(failures))
"""


@pytest.mark.slow  # Triton's interpreter in a child process: 8 s on 2 cores
def test_the_triton_kernel_computes_conv2d_and_its_fp8_reference():
    pytest.importorskip("triton", reason="triton is in the dev install (pyproject.toml)")
    assert interpreted(INTERPRETED, SHAPES) == []


def test_a_weight_matrix_that_does_not_fit_the_input_is_refused():
    with pytest.raises(ValueError, match="does not fit 32 channels and a 3x3 kernel"):
        fp8_conv.conv2d(
            torch.zeros(1, 32, 4, 4), torch.zeros(8, 9 * 16), torch.ones(1), None, (3, 3), 1, 1, torch.float32
        )


def conv(c: int = 32, c_out: int = 48, **kwargs) -> torch.nn.Conv2d:
    torch.manual_seed(0)
    return torch.nn.Conv2d(c, c_out, 3, padding=1, **kwargs).requires_grad_(False)


def test_a_static_fp8_conv_computes_what_the_conv_did_within_fp8_error_and_follows_its_weight():
    original = conv()
    x = torch.randn(2, 32, 12, 12)
    want = original(x)
    layer = fp8.StaticFP8Conv2d.replacing(original, input_amax=float(x.abs().amax()))
    got = layer(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    error = float((got - want).norm() / want.norm())
    assert 0 < error < 0.08, error  # e4m3: a few percent, never exact
    assert layer.weight is original.weight  # adapters merge into the weight it keeps

    with torch.no_grad():
        original.weight.mul_(2.0)  # an adapter merged
    stale = layer(x)
    layer.quantize_weight()
    want = F.conv2d(x, original.weight, original.bias, padding=1)
    assert float((layer(x) - want).norm() / want.norm()) < 0.08
    assert float((stale - want).norm() / want.norm()) > 0.3


def test_an_fp8_conv_of_zeros_gives_the_bias_not_nan():
    layer = fp8.StaticFP8Conv2d.replacing(conv(), input_amax=0.0)
    out = layer(torch.zeros(1, 32, 4, 4))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, layer.bias.reshape(1, -1, 1, 1).expand_as(out))


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_the_compiler_traces_the_layer_as_one_op_and_the_output_keeps_the_inputs_layout(layout):
    """``aot_eager`` runs the op's fake implementation to trace, then the real one: shapes,
    dtype and layout must agree, or a compiled UNet breaks on the GPU."""
    layer = fp8.StaticFP8Conv2d.replacing(conv(stride=2), input_amax=4.0)
    x = torch.randn(2, 32, 9, 9).contiguous(memory_format=layout)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    torch.testing.assert_close(out, layer(x))
    assert out.is_contiguous(memory_format=layout)
    assert (layout == torch.contiguous_format) == out.is_contiguous()


@pytest.mark.parametrize(
    ("module", "taken"),
    [
        (torch.nn.Conv2d(32, 48, 3, padding=1), True),
        (torch.nn.Conv2d(32, 32, 3, stride=2, padding=1), True),
        (torch.nn.Conv2d(32, 48, 1), False),  # 1x1: measured no better with its input's cast
        (torch.nn.Conv2d(4, 32, 3, padding=1), False),  # conv_in: 4 channels
        (torch.nn.Conv2d(32, 32, 3, padding=1, groups=2), False),
        (torch.nn.Conv2d(32, 32, 3, padding=2, dilation=2), False),
        (torch.nn.Conv2d(32, 32, 3, padding=1, padding_mode="reflect"), False),
        (torch.nn.Conv2d(40, 40, 3, padding=1), False),  # not a multiple of 16
    ],
)
def test_which_convolutions_fp8_takes(monkeypatch, module, taken):
    monkeypatch.setattr(fp8, "MIN_FEATURES", 32)
    assert fp8.conv_candidate(module) is taken


def test_without_fp8_convs_the_convolutions_stay_fp16(monkeypatch):
    monkeypatch.setattr(fp8, "MIN_FEATURES", 32)
    assert fp8.quantizable("down.conv", torch.nn.Conv2d(32, 48, 3, padding=1))
    monkeypatch.setattr(fp8, "CONVS", False)
    assert not fp8.quantizable("down.conv", torch.nn.Conv2d(32, 48, 3, padding=1))


def test_without_triton_on_a_gpu_the_convolutions_stay_fp16_with_one_line(monkeypatch, caplog):
    """A CUDA torch brings Triton; an image that lacks it still serves, the convolutions in fp16."""
    monkeypatch.setattr(fp8, "MIN_FEATURES", 32)
    model = torch.nn.Sequential(torch.nn.Conv2d(32, 48, 3, padding=1), torch.nn.Linear(48, 48))
    pipe = type("Pipe", (), {"unet": model})()
    monkeypatch.setattr(fp8_conv, "available", lambda device: False)
    with caplog.at_level("WARNING", logger="diffq.worker"):
        assert fp8.quantize(pipe, {"0": 1.0, "1": 1.0}) == 1
    assert type(model[0]) is torch.nn.Conv2d and isinstance(model[1], fp8.StaticFP8Linear)
    assert [r.getMessage() for r in caplog.records] == [
        "fp8: Triton is not installed, so the convolutions stay fp16 (pip install triton)"
    ]
    monkeypatch.setattr(fp8_conv, "available", lambda device: True)
    assert fp8.quantize(pipe, {"0": 1.0}) == 1 and isinstance(model[0], fp8.StaticFP8Conv2d)
