"""``--precision fp8``: static-scale FP8 linears, calibrated once per model and host, following
merged adapters, reported by the job and by status; off FP8 hardware, one line and fp16.

Runs diffq's code on the CPU with the tiny model, whose layers are 32-512 wide
(its own limits, ``fp8.OWN_LIMITS``, let its linears qualify). Off CUDA the GEMM
is diffq's fp32 reference (:mod:`worker.pipelines.fp8_gemm`), never torch's CPU FP8 kernels,
whose speed and overflow behaviour depend on the CPU model; ``bench/fp8_gemm.py`` checks the
reference against ``torch._scaled_mm`` on a GPU. Speed is measured on the GPU
(docs/benchmarks.md); nothing here asserts a time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_FLAGS, producer, run_worker, write_csv
from rq.job import Job
from rq.serializers import JSONSerializer

from common.errors import ConfigError
from common.jobspec import GenParams
from common.queues import get_queue
from producer.status import _running
from worker.pipelines import fp8, fp8_gemm
from worker.pipelines.backend import Batch
from worker.pipelines.speedups import Speedups
from worker.pipelines.warm import WarmPipelines

PARAMS = GenParams(model="tiny", width=64, height=64, steps=4, guidance=5.0)


@pytest.fixture
def small_layers(monkeypatch):
    """The tiny model's calibration is 4 prompts at 3 steps (what the calibration covers is the
    same code; 16 prompts at 10 steps took 6.5 s of each test). Its layers qualify by its own
    limits (fp8.OWN_LIMITS)."""
    monkeypatch.setattr(fp8, "CALIBRATION_PROMPTS", fp8.CALIBRATION_PROMPTS[:4])
    monkeypatch.setattr(fp8, "CALIBRATION_BATCH", 4)
    monkeypatch.setattr(fp8, "CALIBRATION_STEPS", 3)


@pytest.fixture(scope="module")
def fp8_cache(tmp_path_factory, cache_dir) -> Path:
    """A cache folder of this module's own (the tiny model copied in): its scale file starts
    empty, and the tests after the first find it calibrated."""
    folder = tmp_path_factory.mktemp("fp8cache")
    shutil.copytree(cache_dir, folder, dirs_exist_ok=True)
    return folder


def images(cache: WarmPipelines, adapter: str | None = None) -> list[np.ndarray]:
    loaded, _ = cache.get("tiny")
    cache.use_adapter(loaded, adapter, 1.0)
    prompts = ["a red fox in the snow", "a lighthouse at night"]
    batch = Batch(params=PARAMS, prompts=prompts, negatives=["", ""], seeds=[7, 8], max_batch=4)
    result, _ = cache.generate(loaded, batch)
    return [np.asarray(image, dtype=np.float32) for image in result.images]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b)))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a - b) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.mark.parametrize("granularity", ["tensor", "row"])
def test_a_static_fp8_linear_computes_what_the_linear_did_within_fp8_error(granularity):
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48).requires_grad_(False)
    x = torch.randn(2, 10, 64)
    want = linear(x)
    layer = fp8.StaticFP8Linear.replacing(linear, input_amax=float(x.abs().amax()), granularity=granularity)
    got = layer(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    error = float((got - want).norm() / want.norm())
    assert 0 < error < 0.08, error  # e4m3 has 3 mantissa bits: a few percent, never exact
    assert layer.weight is linear.weight  # adapters merge into the weight it keeps

    # a weight changed in place (an adapter merged) is what the layer computes with once requantized
    with torch.no_grad():
        linear.weight.mul_(2.0)
    stale = layer(x)
    layer.quantize_weight()
    fresh = layer(x)
    want = torch.nn.functional.linear(x, linear.weight, linear.bias)
    assert float((fresh - want).norm() / want.norm()) < 0.08
    assert float((stale - want).norm() / want.norm()) > 0.3


def test_gemms_accumulate_fast_up_to_the_measured_reduction_length_and_in_fp32_beyond(monkeypatch):
    """Fast accumulation was measured on K up to SDXL's 5120; a longer K (FLUX's 12288) keeps the
    fp32 promotion, and the flag reaches the GEMM."""
    seen = []

    def recording(a, b, scale_a, scale_b, bias, out_dtype, fast_accum):
        seen.append(fast_accum)
        return fp8_gemm.reference(a, b, scale_a, scale_b, bias, out_dtype)

    monkeypatch.setitem(fp8_gemm.BACKENDS, "cpu", recording)
    for in_features, fast in [(64, True), (fp8.FAST_ACCUM_MAX_K, True), (fp8.FAST_ACCUM_MAX_K + 1, False)]:
        layer = fp8.StaticFP8Linear.replacing(torch.nn.Linear(in_features, 16), input_amax=1.0)
        assert layer.fast_accum is fast
        layer(torch.randn(3, in_features))
        assert seen[-1] is fast


def test_a_transposed_input_reaches_the_gemm_row_major_as_cublaslt_requires(monkeypatch):
    """cuBLASLt's FP8 GEMM takes its first operand row-major only ("Only multiplication of
    row-major and column-major matrices is supported by cuBLASLt", every job of a no-CFG FP8
    campaign on an H200): a layer given a transposed view hands the GEMM a row-major copy."""

    def cublaslt_rule(a, b, scale_a, scale_b, bias, out_dtype, fast_accum):
        if a.stride(-1) != 1 or b.stride(0) != 1:
            raise RuntimeError("Only multiplication of row-major and column-major matrices is supported by cuBLASLt")
        return fp8_gemm.reference(a, b, scale_a, scale_b, bias, out_dtype)

    monkeypatch.setitem(fp8_gemm.BACKENDS, "cpu", cublaslt_rule)
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32).requires_grad_(False)
    layer = fp8.StaticFP8Linear.replacing(linear, input_amax=4.0)
    x = torch.randn(1, 64, 40).transpose(1, 2)  # (1, 40, 64) rows read from a (C, HW) map
    assert not x.reshape(-1, 64).is_contiguous()
    got, want = layer(x), linear(x)
    assert float((got - want).norm() / want.norm()) < 0.08


def test_a_linear_writing_fp8_returns_its_output_in_the_models_dtype_saturated_not_nan():
    """``fp8.ACTIVATIONS``: the GEMM writes FP8 at the calibrated output scale (folded into
    the input's scale and the bias); what overshoots saturates at the calibrated magnitude, and
    a bias changed by an adapter is followed once requantized."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96).requires_grad_(False)
    x = torch.randn(300, 64)
    want = linear(x)
    layer = fp8.StaticFP8Linear.replacing(linear, float(x.abs().amax()), "tensor", float(want.abs().amax()))
    assert layer.fp8_output
    got = layer(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert 0 < float((got - want).norm() / want.norm()) < 0.1
    over = layer(4 * x)
    assert torch.isfinite(over).all() and float(over.abs().max()) <= float(want.abs().amax()) * 1.001
    with torch.no_grad():
        linear.bias.add_(0.5)
    layer.quantize_weight()
    assert float((layer(x) - linear(x)).norm() / linear(x).norm()) < 0.1
    # per-row weight scales keep the model's dtype out of the GEMM
    assert not fp8.StaticFP8Linear.replacing(linear, 1.0, "row", 1.0).fp8_output


def test_an_fp8_output_saturates_even_where_the_backend_writes_nan_past_448(monkeypatch):
    """torch's CPU kernel turned 4,081 of 4,082 outputs past ±448 into NaN where cuBLASLt
    saturates: whatever a backend does, an overshoot of the calibrated output scale ends at
    the calibrated magnitude of its own sign, never NaN."""
    written = []

    def nan_past_448(a, b, scale_a, scale_b, bias, out_dtype, fast_accum):
        out = (a.float() @ b.float()) * scale_a * scale_b + (0 if bias is None else bias.float())
        bits = out.clamp(-448, 448).to(out_dtype).view(torch.uint8)
        nan = torch.where(out < 0, 0xFF, 0x7F).to(torch.uint8)  # E4M3's NaN, with the sign bit
        written.append(torch.where(out.abs() > 448, nan, bits).view(out_dtype))
        return written[-1]

    monkeypatch.setitem(fp8_gemm.BACKENDS, "cpu", nan_past_448)
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96).requires_grad_(False)
    x = torch.randn(300, 64)
    want = linear(x)
    amax = float(want.abs().amax())
    layer = fp8.StaticFP8Linear.replacing(linear, float(x.abs().amax()), "tensor", amax)
    over = layer(4 * x)
    nan = torch.isnan(written[-1].float()).reshape(over.shape)
    assert nan.sum() > 100  # the stand-in did write NaN
    assert torch.isfinite(over).all() and float(over.abs().max()) <= amax * 1.001
    negative = (written[-1].view(torch.uint8) >= 0x80).reshape(over.shape)
    saturated = torch.where(negative, -amax, amax)  # each overshoot at the calibrated magnitude, its own sign
    assert torch.allclose(over[nan], saturated[nan], rtol=1e-3)


def test_saturate_makes_each_nan_byte_448_of_its_sign_and_leaves_every_other_byte():
    every = torch.arange(256, dtype=torch.uint8).view(fp8_gemm.E4M3)
    out = fp8_gemm.saturate(every).view(torch.uint8)
    nan = {0x7F, 0xFF}
    assert [int(b) for b in out] == [b - 1 if b in nan else b for b in range(256)]
    assert fp8_gemm.saturate(every).float()[[0x7F, 0xFF]].tolist() == [448.0, -448.0]


def test_the_reference_gemm_is_the_fp32_product_of_the_fp8_values_scaled():
    """What cuBLASLt computes (exact products, fp32 sums, scales and bias in fp32, one cast): the
    GPU bench (bench/fp8_gemm.py) checks ``torch._scaled_mm`` against this function."""
    torch.manual_seed(0)
    a = (torch.randn(32, 48) * 100).clamp(-448, 448).to(fp8_gemm.E4M3)
    b = (torch.randn(48, 16) * 100).clamp(-448, 448).to(fp8_gemm.E4M3)
    sa, sb, bias = torch.tensor(0.02), torch.tensor(0.5), torch.randn(16)
    want = (a.double() @ b.double()) * 0.02 * 0.5 + bias.double()
    got = fp8_gemm.reference(a, b, sa, sb, bias, torch.float32)
    assert got.dtype == torch.float32 and torch.allclose(got.double(), want, rtol=1e-5, atol=1e-4)
    rows = fp8_gemm.reference(a, b, torch.full((32, 1), 0.02), torch.full((1, 16), 0.5), None, torch.bfloat16)
    assert rows.dtype == torch.bfloat16 and torch.allclose(rows.double(), want - bias.double(), rtol=1e-2)
    fp8_out = fp8_gemm.reference(a, b, sa * 1e3, sb, None, fp8_gemm.E4M3)  # far past 448: saturated
    assert fp8_out.float().abs().max() == 448 and torch.isfinite(fp8_out.float()).all()


def test_zero_activations_give_zeros_not_nan():
    """SDXL encodes an empty negative prompt as zeros: an amax of 0 must not become a scale of 0."""
    layer = fp8.StaticFP8Linear.replacing(torch.nn.Linear(64, 32, bias=False), input_amax=0.0)
    out = layer(torch.zeros(4, 64))
    assert torch.isfinite(out).all() and out.abs().max() == 0


def test_fp8_images_stay_close_to_the_fp32_ones_and_leave_the_short_and_text_layers_alone(
    small_layers, fp8_cache, caplog
):
    plain = images(WarmPipelines(str(fp8_cache), device="cpu"))
    with caplog.at_level("INFO", logger="diffq.worker"):
        cache = WarmPipelines(str(fp8_cache), device="cpu", precision="fp8")
        quantized = images(cache)
    assert "fp8: calibrating tiny" in caplog.text
    pipe = cache.get("tiny")[0].pipe
    names = {name for name, module in pipe.unet.named_modules() if isinstance(module, fp8.StaticFP8Linear)}
    assert any(name.endswith("attn1.to_q") for name in names)
    assert any(name.endswith("ff.net.2") for name in names)
    assert not [name for name in names if name.endswith(("attn2.to_k", "attn2.to_v"))]  # read the text
    assert not [name for name in names if "time_emb" in name]  # one row per image: calibration saw it short
    convs = {name for name, module in pipe.unet.named_modules() if isinstance(module, fp8.StaticFP8Conv2d)}
    assert any(name.endswith("resnets.0.conv1") for name in convs)  # the 3x3 convolutions too
    assert "conv_in" not in convs and "conv_out" not in convs  # 4 channels: they stay
    for a, b in zip(plain, quantized, strict=True):
        assert not np.array_equal(a, b)  # FP8 did run
        assert psnr(a, b) > 25, psnr(a, b)
    scales = json.loads((fp8_cache / fp8.SCALES_FILE).read_text())
    assert [entry["model"] for entry in scales.values()] == ["tiny"]


def test_the_feed_forwards_activation_inputs_are_written_in_fp8_when_asked(small_layers, fp8_cache, monkeypatch):
    """The linears that feed GEGLU are calibrated at their outputs too; by default exactly those
    write FP8, and the images stay close to fp32's; without ``fp8.ACTIVATIONS`` none does."""
    plain = images(WarmPipelines(str(fp8_cache), device="cpu"))
    cache = WarmPipelines(str(fp8_cache), device="cpu", precision="fp8")
    quantized = images(cache)
    unet = cache.get("tiny")[0].pipe.unet
    writing = {n for n, m in unet.named_modules() if isinstance(m, fp8.StaticFP8Linear) and m.fp8_output}
    assert writing and all(name.endswith("ff.net.0.proj") for name in writing)
    assert all(type(unet.get_submodule(name.removesuffix(".proj"))).__name__ == "GEGLU" for name in writing)
    # their GELU is the tanh form (fp8.FAST_GELU), every other GEGLU keeps diffusers' own
    fast = {n for n, m in unet.named_modules() if m.__dict__.get("gelu") is fp8.tanh_gelu}
    assert fast == {name.removesuffix(".proj") for name in writing}
    scales = next(iter(json.loads((fp8_cache / fp8.SCALES_FILE).read_text()).values()))["scales"]
    assert {name + fp8.OUTPUT for name in writing} == {k for k in scales if k.endswith(fp8.OUTPUT)}
    for a, b in zip(plain, quantized, strict=True):
        assert psnr(a, b) > 25, psnr(a, b)
    monkeypatch.setattr(fp8, "ACTIVATIONS", False)
    cache = WarmPipelines(str(fp8_cache), device="cpu", precision="fp8")
    images(cache)
    assert not any(getattr(m, "fp8_output", False) for m in cache.get("tiny")[0].pipe.unet.modules())
    assert not any("gelu" in m.__dict__ for m in cache.get("tiny")[0].pipe.unet.modules())


def test_the_tanh_gelu_is_the_tanh_approximation_within_5e_4_of_the_exact_one_and_finite_in_fp16():
    x = torch.linspace(-12, 12, 200_001, dtype=torch.float32)
    got = fp8.tanh_gelu(x)
    assert torch.allclose(got, torch.nn.functional.gelu(x, approximate="tanh"), atol=2e-6)
    assert float((got - torch.nn.functional.gelu(x)).abs().max()) < 5e-4
    half = torch.tensor([-60000.0, -100.0, -3.0, 0.0, 3.0, 100.0, 60000.0], dtype=torch.float16)
    out = fp8.tanh_gelu(half)  # the cube of these overflows fp16: computed in fp32
    assert out.dtype == torch.float16 and bool(out.isfinite().all())
    assert out[-1] == half[-1] and out[0] == 0 and out[3] == 0


def test_a_second_worker_loads_the_hosts_scales_instead_of_calibrating(small_layers, fp8_cache, caplog, monkeypatch):
    images(WarmPipelines(str(fp8_cache), device="cpu", precision="fp8"))  # calibrated here if not before
    calibrations = []
    monkeypatch.setattr(fp8, "calibrate", lambda *args: calibrations.append(args) or {})
    with caplog.at_level("INFO", logger="diffq.worker"):
        images(WarmPipelines(str(fp8_cache), device="cpu", precision="fp8"))
    assert calibrations == [] and "static per-tensor scales (loaded)" in caplog.text


def test_an_unreadable_scale_file_is_calibrated_again_with_one_warning(small_layers, tmp_path, cache_dir, caplog):
    shutil.copytree(cache_dir, tmp_path, dirs_exist_ok=True)
    (tmp_path / fp8.SCALES_FILE).write_text('{"half a fi')
    with caplog.at_level("INFO", logger="diffq.worker"):
        images(WarmPipelines(str(tmp_path), device="cpu", precision="fp8"))
    assert "unreadable" in caplog.text and "calibrating tiny" in caplog.text
    assert json.loads((tmp_path / fp8.SCALES_FILE).read_text())  # whole again


def test_an_adapter_merged_into_an_fp8_worker_is_what_its_fp8_layers_compute(small_layers, fp8_cache):
    """Adapters merge into the fp16 weights; the FP8 copies follow, so a DoRA job under fp8 is
    the DoRA image (near the unquantized one), not the base model's."""
    base = WarmPipelines(str(fp8_cache), device="cpu")
    want = images(base, "tiny-dora")
    cache = WarmPipelines(str(fp8_cache), device="cpu", precision="fp8")
    without = images(cache)
    with_adapter = images(cache, "tiny-dora")
    merged = cache.get("tiny")[0].merged
    assert merged.direct and not merged.peft  # read and merged by diffq's own reader, not PEFT's slower load
    back = images(cache)
    plain = images(base)
    for w, got, no, p in zip(want, with_adapter, without, plain, strict=True):
        # the adapter's image, not the base one. On the tiny model the adapter moves an image
        # about as far as FP8 does (37 dB), so the margins are measured ones: with the FP8 copies
        # refreshed 2.7-3.3 dB closer and the change 0.57-0.61 aligned with fp32's (cosine); with
        # them left stale (fp8.refresh skipped) 0.3-0.6 dB and 0.22-0.26
        assert psnr(w, got) > psnr(w, no) + 1.5
        assert cosine(w - p, got - no) > 0.4
        assert psnr(w, got) > 25
    for a, b in zip(back, without, strict=True):
        assert np.array_equal(a, b)  # the adapter taken out: the base FP8 weights again, exactly


def test_a_gpu_without_fp8_gets_one_line_and_fp16(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with caplog.at_level("WARNING", logger="diffq.worker"):
        speedups = Speedups.parse("auto", torch.device("cuda"), "fp8")
    assert "fp8" not in speedups
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "A100" in lines[0] and "sm_80" in lines[0] and "runs fp16" in lines[0]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert "fp8" in Speedups.parse("auto", torch.device("cuda"), "fp8")


def test_an_unknown_precision_is_one_line_naming_the_flag(monkeypatch):
    from common.settings import Settings

    monkeypatch.setenv("DIFFQ_PRECISION", "fp4")
    with pytest.raises(ConfigError, match=r"--precision 'fp4': use one of fp16, fp8"):
        Settings.load()


@pytest.mark.worker
def test_a_worker_run_with_precision_fp8_says_so_in_each_job_result(env, tmp_path, conn, fp8_cache):
    env = {**env, "DIFFQ_CACHE": str(fp8_cache)}
    prompts = write_csv(tmp_path / "p.csv", "prompt\na red fox\na blue bird\n")
    out = tmp_path / "out"
    assert producer("enqueue", prompts, "--output", out, *TINY_FLAGS, "--chunk-size", "1").exit_code == 0
    run = run_worker(env, "--precision", "fp8")
    assert run.returncode == 0, run.stderr
    assert "FP8 with static per-tensor scales" in run.stderr
    queue = get_queue("diffq", conn)
    jobs = Job.fetch_many(queue.finished_job_registry.get_job_ids(), connection=conn, serializer=JSONSerializer)
    results = [job.return_value() for job in jobs]
    assert len(results) == 2 and {r["precision"] for r in results} == {"fp8"}
    assert {job.meta.get("precision") for job in jobs} == {"fp8"}  # what status shows beside a running job
    assert _running(jobs[0].id, jobs[0]).text().endswith(", fp8")
    assert len(list(out.rglob("*.png"))) == 2


def test_a_batch_whose_fp8_pixels_are_not_finite_runs_again_without_fp8_and_says_so_once(
    small_layers, fp8_cache, monkeypatch, caplog
):
    """A GEMM that writes NaN (a backend that does not saturate, an activation far past its
    scale) must never become a black image: the batch runs again with the kept fp32 weights,
    its images are the model's own, the job reports that precision, and the log says it once."""
    want = images(WarmPipelines(str(fp8_cache), device="cpu"))
    cache = WarmPipelines(str(fp8_cache), device="cpu", precision="fp8")
    images(cache)  # calibrated and quantized with the reference GEMM

    def nan(a, b, scale_a, scale_b, bias, out_dtype, fast_accum):
        return torch.full((a.shape[0], b.shape[1]), np.nan).to(out_dtype)

    monkeypatch.setitem(fp8_gemm.BACKENDS, "cpu", nan)
    with caplog.at_level("WARNING", logger="diffq.worker"):
        got = images(cache)
        loaded = cache.get("tiny")[0]
        batch = Batch(params=PARAMS, prompts=["a red fox"], negatives=[""], seeds=[7], max_batch=1)
        assert cache.generate(loaded, batch)[0].precision == "fp32"  # the second batch to fall back
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, b)  # the model's own images, not FP8's
    said = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert len(said) == 1 and "ran again without FP8" in said[0]
    assert loaded.fp8_fallbacks == 2 and all(not layer.bypass for layer in fp8.layers(loaded.pipe))


def test_a_batch_with_non_finite_pixels_and_no_fp8_to_drop_writes_nothing_and_fails_the_job(cache_dir, monkeypatch):
    from worker.pipelines.pixels import NonFinitePixels

    cache = WarmPipelines(str(cache_dir), device="cpu")
    loaded, _ = cache.get("tiny")
    monkeypatch.setattr(loaded.pipe.vae, "decode", lambda *a, **k: (torch.full((1, 3, 64, 64), np.nan),))
    batch = Batch(params=PARAMS, prompts=["a red fox"], negatives=[""], seeds=[7], max_batch=1)
    with pytest.raises(NonFinitePixels, match=r"non-finite pixels .* nothing of it was written"):
        cache.generate(loaded, batch)


def test_the_precision_a_job_reports_is_the_weights_own(cache_dir):
    """A preset loaded in another dtype than the worker's (flux-random is bf16 on a GPU whatever
    --dtype says) reports that dtype: on an H100 a bf16 FLUX job said fp16 (2026-11-26)."""
    cache = WarmPipelines(str(cache_dir), device="cpu", dtype="float32")
    loaded, _ = cache.get("tiny")
    loaded.pipe.to(torch.bfloat16)
    try:
        batch = Batch(params=PARAMS, prompts=["a red fox"], negatives=[""], seeds=[7], max_batch=1)
        result, _ = cache.generate(loaded, batch)
    finally:
        loaded.pipe.to(torch.float32)
    assert result.precision == "bf16"


def test_after_a_switch_only_the_layers_adapters_touched_are_quantized_again_and_nothing_else_differs(
    small_layers, fp8_cache
):
    """A switch re-quantizes the layers adapters have touched, not all FP8 layers: a full
    refresh afterwards finds every FP8 weight already what it computes."""
    cache = WarmPipelines(str(fp8_cache), device="cpu", precision="fp8")
    images(cache, "tiny-dora")
    loaded = cache.get("tiny")[0]
    every = list(fp8.layers(loaded.pipe))
    touched = loaded.merged.touched()
    assert 0 < len([m for m in every if any(m is t for t in touched)]) < len(every)
    after_switch = [layer.weight_fp8.view(torch.uint8).clone() for layer in every]
    assert fp8.refresh(loaded.pipe) == len(every)
    assert all(torch.equal(a, layer.weight_fp8.view(torch.uint8)) for a, layer in zip(after_switch, every, strict=True))
