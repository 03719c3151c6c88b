"""Speed levers on the CPU with the tiny model: the compiled path (warm-up, no graph built after
it across batch sizes and adapters, DoRA on compiled blocks), merged adapters against PEFT's
unmerged forward (FP8: tests/test_fp8.py). Speed itself is measured on GPUs
(bench/, docs/benchmarks.md); nothing here asserts a time."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import torch

from common.jobspec import GenParams
from common.presets import CUDA_DEFAULT_SPEEDUPS as CUDA_DEFAULT
from common.presets import speedup_names
from worker.pipelines.backend import Batch
from worker.pipelines.generate import run_batch
from worker.pipelines.precompiled import Precompiled
from worker.pipelines.speedups import Speedups
from worker.pipelines.warm import WarmPipelines

PARAMS = GenParams(model="tiny", width=64, height=64, steps=2, guidance=5.0)


def pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.float32)


def job(cache: WarmPipelines, n: int, adapter=None, scale=1.0, max_batch=4, heard: list | None = None):
    """What a worker does for one job: the adapter, then the batch (split at ``max_batch``)."""
    loaded, _ = cache.get("tiny")
    cache.use_adapter(loaded, adapter, scale)
    params = GenParams(**{**PARAMS.__dict__, "adapter": adapter, "adapter_scale": scale})
    prompts = [f"a red fox {i}" for i in range(n)]
    on_progress = heard.append if heard is not None else None
    batch = Batch(params, prompts, [""] * n, list(range(7, 7 + n)), max_batch=max_batch)
    result, _ = cache.generate(loaded, batch, on_progress=on_progress)
    return result


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_a_compiled_worker_builds_no_graph_after_warm_up_across_batch_sizes_and_adapters(cache_dir):
    """The first job compiles one static graph per region at its batch size; tail chunks are
    padded up to it, a DoRA adapter (which failed on compiled blocks before adapters were
    merged), scale changes and switching back to none run on the graphs that exist. An
    out-of-memory cap compiles the halves' size once, not once per part."""
    cache = WarmPipelines(str(cache_dir), device="cpu", speedups="compile-blocks")
    heard: list = []
    first = job(cache, 4, heard=heard)
    assert first.compiles > 0
    assert heard == ["compiling for 64x64 (once per size and worker; cached on disk)", None]  # shown as the job's state
    heard.clear()
    assert [job(cache, n, heard=heard).compiles for n in (4, 3, 2, 1)] == [0, 0, 0, 0]
    assert [len(job(cache, n).images) for n in (3, 1)] == [3, 1]  # the padding rows are dropped
    assert heard == []
    assert job(cache, 3, max_batch=2).compiles > 0  # split 2 + 1 (padded to 2), as after an OOM
    assert [job(cache, n, max_batch=2).compiles for n in (3, 1)] == [0, 0]
    counts = [job(cache, 4, a, s).compiles for a, s in [("tiny-dora", 1.0), (None, 1.0), ("tiny-dora", 0.5)] * 2]
    assert counts == [0] * 6


@pytest.mark.slow
@pytest.mark.long
def test_compile_unet_matches_eager_and_builds_no_graph_after_warm_up_across_tails_and_adapters(cache_dir, redis_url):
    """The whole UNet as one graph: pixels within 2/255 of eager, and after the warm-up no
    graph at all: not for a tail chunk, nor the first adapter merged into the weights, nor
    adapters switched off again (PEFT's wrappers are out of the model between switches)."""
    eager = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    compiled = WarmPipelines(str(cache_dir), device="cpu", speedups="compile-unet", compile_cache=redis_url)
    reference, first = job(eager, 4), job(compiled, 4)
    assert first.compiles > 0
    assert isinstance(compiled.get("tiny")[0].pipe.unet.forward, Precompiled)
    for ref, got in zip(reference.images, first.images, strict=True):
        assert np.abs(pixels(ref) - pixels(got)).max() <= 2
    runs = [(4, "tiny-dora"), (4, None), (3, None), (4, "tiny-dora"), (1, "tiny-dora"), (4, None)]
    results = [job(compiled, n, a) for n, a in runs]
    assert [r.compiles for r in results] == [0] * 6
    merged = compiled.get("tiny")[0].merged
    assert list(merged.direct) and not merged.peft  # the compiled UNet's layers are read directly

    # a restarted worker, and a new host that finds the file only in the shared Redis: no
    # graph traced, the same pixels, and the adapter merged into the weights the file computes with
    assert compiled.precompiled.compiled == 1
    for host in ("restarted", "new"):
        if host == "new":
            shutil.rmtree(compiled.precompiled.folder)
        again = WarmPipelines(str(cache_dir), device="cpu", speedups="compile-unet", compile_cache=redis_url)
        plain, adapted = job(again, 4), job(again, 4, "tiny-dora")
        assert (plain.compiles, adapted.compiles, again.precompiled.loaded) == (0, 0, 1)
        assert all(np.array_equal(pixels(a), pixels(b)) for a, b in zip(plain.images, first.images, strict=True))
        assert all(np.array_equal(pixels(a), pixels(b)) for a, b in zip(adapted.images, results[0].images, strict=True))


def test_merged_adapters_match_peft_unmerged_forward_and_switch_back_exactly(cache_dir):
    """Merging changes where the adapter's arithmetic happens, not the image: against PEFT's own
    unmerged forward (set_adapters on a second pipeline), within 2/255; none after an adapter is
    the plain image bit for bit (pristine weights, no fp drift from unmerging)."""
    merged = WarmPipelines(str(cache_dir), device="cpu")
    plain = pixels(job(merged, 2).images[1])
    ours = {(a, s): pixels(job(merged, 2, a, s).images[1]) for a, s in [("tiny-dora", 1.0), ("tiny-dora", 0.4)]}
    assert np.array_equal(pixels(job(merged, 2).images[1]), plain)

    reference = WarmPipelines(str(cache_dir), device="cpu")
    loaded, _ = reference.get("tiny")
    loaded.pipe.load_lora_weights(str(cache_dir / "adapters" / "tiny-dora"), adapter_name="ref")
    for (_adapter, scale), image in ours.items():
        loaded.pipe.set_adapters(["ref"], adapter_weights=[scale])
        theirs = pixels(run_batch(loaded.pipe, PARAMS, ["a red fox 0", "a red fox 1"], ["", ""], [7, 8]).images[1])
        assert np.abs(theirs - plain).mean() > 1.0  # the adapter does change the image
        assert np.abs(theirs - image).max() <= 2.0


def test_cuda_defaults_are_the_measured_levers_and_the_cpu_runs_plain():
    assert Speedups.parse("auto", torch.device("cuda")).levers == frozenset(CUDA_DEFAULT)
    assert "compile-unet" in CUDA_DEFAULT and "fp8" not in CUDA_DEFAULT  # fp8 stays opt-in
    assert Speedups.parse("auto", torch.device("cpu")).levers == frozenset()


def test_auto_means_the_levers_of_the_models_family_and_only_its_levers_apply():
    """A FLUX worker's ``auto`` is a DiT's defaults (its blocks and decoder compiled, its
    modulation once an image), not SDXL's, which it cannot take; levers named beside ``auto`` stay
    where the family's code applies them; a lever a family has no code for is left out (an SDXL
    lever named for FLUX, any lever for the generic family); a family's own (FLUX's modulation
    table) applies whatever is named, on the CPU too. The family is the pipeline's class."""
    from common.presets import AUTO_SPEEDUPS

    dit_default = frozenset(AUTO_SPEEDUPS["flux"])

    def pipe(name: str) -> object:
        return type(name, (), {})()

    sdxl, flux, sd3 = pipe("StableDiffusionXLPipeline"), pipe("FluxPipeline"), pipe("StableDiffusion3Pipeline")
    other = pipe("SanaPipeline")
    auto = Speedups.parse("auto,cuda-graphs", torch.device("cuda"))
    assert auto.for_pipeline(sdxl).levers == frozenset(CUDA_DEFAULT) | {"cuda-graphs"}
    assert auto.for_pipeline(flux).levers == dit_default | {"cuda-graphs", "modulation-once"}
    assert auto.for_pipeline(sd3).levers == {"compile-blocks", "compile-vae"}
    assert auto.for_pipeline(other).levers == frozenset()
    assert auto.per_kind() == (  # the worker's first line, before it knows its model
        "compile-unet,compile-vae,cuda-graphs,empty-negative,vae-fp16 for SDXL, "
        "compile-blocks,compile-vae,cuda-graphs,modulation-once,vae-fp16 for FLUX, "
        "compile-blocks,compile-vae for SD3 and PixArt"
    )
    assert dit_default == {"vae-fp16", "compile-blocks", "compile-vae"}
    named = Speedups.parse("vae-fp16,compile-unet", torch.device("cuda"))
    assert named.for_pipeline(sdxl).levers == named.levers
    assert named.for_pipeline(flux).levers == {"vae-fp16", "modulation-once"}  # FLUX has no UNet to compile whole
    assert named.for_pipeline(other).levers == frozenset()
    assert Speedups.parse("auto", torch.device("cpu")).for_pipeline(flux).levers == {"modulation-once"}
    assert Speedups.parse("none", torch.device("cpu")).for_pipeline(sdxl).levers == frozenset()


@pytest.mark.parametrize("lever", ["channels-last", "cudnn-benchmark", "compile-resnets", "modulation-once", "fp8"])
def test_a_retired_lever_is_refused_with_its_reason_at_start(lever: str) -> None:
    """A lever that no longer pays is gone from ``--speedups`` (at most 9 levers, each with a
    measured gain); a user whose .env still names one reads why in one line, before a GPU is leased."""
    from common.errors import ConfigError
    from common.presets import RETIRED_LEVERS, SPEEDUP_LEVERS
    from common.settings import Settings

    assert lever not in SPEEDUP_LEVERS and len(SPEEDUP_LEVERS) <= 9
    with pytest.raises(ConfigError) as caught:
        Settings.load(speedups=f"vae-fp16,{lever}")
    assert str(caught.value) == f"--speedups / DIFFQ_SPEEDUPS: {lever} is {RETIRED_LEVERS[lever]}; drop it"


COMPILE_SCRIPT = """
import sys
from torch._dynamo.utils import counters
from worker.pipelines.backend import Batch
from worker.pipelines.warm import WarmPipelines
from common.jobspec import GenParams
cache = WarmPipelines(sys.argv[1], device="cpu", speedups="compile-blocks")
loaded, _ = cache.get("tiny")
params = GenParams(model="tiny", width=64, height=64, steps=2, guidance=5.0)
result, _ = cache.generate(loaded, Batch(params, ["a red fox"] * 4, [""] * 4, [1, 2, 3, 4], max_batch=4))
print("hits", counters["inductor"]["fxgraph_cache_hit"], "misses", counters["inductor"]["fxgraph_cache_miss"])
"""


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_a_restarted_worker_compiles_from_the_hosts_cache(tmp_path, cache_dir):
    """The first worker on a host compiles its graphs' kernels and leaves them under
    ``$DIFFQ_CACHE/inductor``; the next worker's warm-up finds every graph there."""
    import shutil

    shutil.copytree(cache_dir / "models", tmp_path / "models")  # the tiny model, not the compile cache
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("TORCHINDUCTOR", "TORCH_COMPILE"))}

    def worker_start() -> tuple[int, int]:
        run = subprocess.run(
            [sys.executable, "-c", COMPILE_SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
        )
        assert run.returncode == 0, run.stderr[-2000:]
        words = run.stdout.split()
        return int(words[words.index("hits") + 1]), int(words[words.index("misses") + 1])

    cold_hits, cold_misses = worker_start()
    warm_hits, warm_misses = worker_start()
    assert (tmp_path / "inductor").is_dir()
    assert cold_misses > 0
    assert (warm_hits, warm_misses) == (cold_hits + cold_misses, 0)


NO_COMPILER_SCRIPT = """
import sys
import torch._inductor.config as inductor
inductor.cpp.cxx = ("/nonexistent-cc",)  # what a slim image without gcc looks like to Inductor
from worker.pipelines.backend import Batch
from worker.pipelines.warm import WarmPipelines
from common.jobspec import GenParams
cache = WarmPipelines(sys.argv[1], device="cpu", speedups="compile-blocks")
loaded, _ = cache.get("tiny")
params = GenParams(model="tiny", width=64, height=64, steps=2, guidance=5.0)
for n in (2, 3):
    result, _ = cache.generate(loaded, Batch(params, ["a red fox"] * n, [""] * n, list(range(n)), max_batch=4))
    print("images", len(result.images), "levers", cache.speedups.describe())
"""


@pytest.mark.worker  # a process of its own that loads the pipeline, as a worker does
@pytest.mark.long
def test_a_worker_that_cannot_compile_runs_its_jobs_eagerly_and_says_why_once(tmp_path, cache_dir):
    """torch.compile needs a C compiler (and Python headers for Triton on GPUs): a worker without
    them must not fail the queue's jobs. The first job's compile fails for real here (Inductor
    finds no C++ compiler); the worker says so in one log line and runs every job eagerly."""
    import shutil

    shutil.copytree(cache_dir / "models", tmp_path / "models")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("TORCHINDUCTOR", "TORCH_COMPILE"))}
    run = subprocess.run(
        [sys.executable, "-c", NO_COMPILER_SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines() == ["images 2 levers none", "images 3 levers none"]
    told = [line for line in run.stderr.splitlines() if "torch.compile failed on this worker" in line]
    assert len(told) == 1 and "No working C++ compiler" in told[0] and "--speedups none" in told[0]


#: a FLUX pipeline small enough for the CPU: one double- and one single-stream block
TINY_FLUX = {
    "transformer": {"patch_size": 1, "in_channels": 16, "num_layers": 1, "num_single_layers": 1,
                    "attention_head_dim": 16, "num_attention_heads": 2, "joint_attention_dim": 32,
                    "pooled_projection_dim": 32, "guidance_embeds": True, "axes_dims_rope": [4, 6, 6]},
    "vae": {"sample_size": 32, "in_channels": 3, "out_channels": 3, "block_out_channels": (4,), "layers_per_block": 1,
            "latent_channels": 4, "norm_num_groups": 1, "use_quant_conv": False, "use_post_quant_conv": False,
            "shift_factor": 0.0609, "scaling_factor": 1.5035, "down_block_types": ("DownEncoderBlock2D",),
            "up_block_types": ("UpDecoderBlock2D",)},
    "clip": {"hidden_size": 32, "intermediate_size": 37, "num_attention_heads": 4, "num_hidden_layers": 1,
             "projection_dim": 32, "hidden_act": "gelu", "layer_norm_eps": 1e-5},
    "t5": {"d_model": 32, "d_ff": 37, "d_kv": 8, "num_heads": 4, "num_layers": 1, "relative_attention_num_buckets": 8},
}  # fmt: skip


def assert_compiled_matches_eager(eager: Any, compiled: Any, params: GenParams) -> None:
    """The compiled pipeline's images are the eager one's (within 2/255); its first batch builds
    graphs and a second builds none, to the same pixels."""
    from worker.pipelines.speedups import graphs_compiled

    prompts, seeds = ["a red fox", "a blue jay"], [3, 4]
    reference = run_batch(eager, params, prompts, ["", ""], seeds)
    before = graphs_compiled()
    first = run_batch(compiled, params, prompts, ["", ""], seeds)
    assert graphs_compiled() > before
    built = graphs_compiled()
    again = run_batch(compiled, params, prompts, ["", ""], seeds)
    assert graphs_compiled() == built
    for ref, got, second in zip(reference.images, first.images, again.images, strict=True):
        assert np.abs(pixels(ref) - pixels(got)).max() <= 2
        assert np.array_equal(pixels(got), pixels(second))


@pytest.mark.long
@pytest.mark.slow  # torch.compile of a FLUX transformer on the CPU: half a minute on a busy box
@pytest.mark.soak
def test_compile_blocks_compiles_a_flux_transformers_blocks_and_changes_no_pixel():
    """The DiT path of ``compile-blocks`` (xDiT groups run FLUX): each repeated block compiled
    regionally, the images those of the eager pipeline, and a second batch builds no graph."""
    from worker.pipelines.models import build_flux
    from worker.pipelines.speedups import apply

    params = GenParams(model="tiny-flux", width=32, height=32, steps=2, guidance=3.5)
    eager = build_flux(**TINY_FLUX, t5_vocab=None, clip_vocab=None)
    compiled = copy.deepcopy(eager)
    apply(compiled, Speedups(frozenset({"compile-blocks"})))
    blocks = [*compiled.transformer.transformer_blocks, *compiled.transformer.single_transformer_blocks]
    assert all(block._compiled_call_impl is not None for block in blocks)
    assert_compiled_matches_eager(eager, compiled, params)


@pytest.mark.slow  # a compile: 8-11 s on 2 cores
@pytest.mark.long
def test_compile_vae_compiles_a_flux_decoder_and_changes_no_pixel(tmp_path):
    """``compile-vae`` on a DiT pipeline (a FLUX worker's and group's default): its decoder is
    one graph, as SDXL's (eager, ATen's GroupNorm gives one image's group one thread block); the
    images are the eager pipeline's and a second batch builds no graph. Under ``--parallel-vae``
    a group leaves it out: xDiT decodes with its own copy of the decoder's layers."""
    from common.settings import Settings
    from worker.group.config import GroupLayout
    from worker.group.engine import RankEngine
    from worker.pipelines.models import build_flux
    from worker.pipelines.speedups import apply

    params = GenParams(model="tiny-flux", width=32, height=32, steps=2, guidance=3.5)
    eager = build_flux(**TINY_FLUX, t5_vocab=None, clip_vocab=None)
    compiled = copy.deepcopy(eager)
    apply(compiled, Speedups(frozenset({"compile-vae"})))
    assert compiled.vae.decoder._compiled_call_impl is not None
    assert compiled.transformer._compiled_call_impl is None  # the decoder alone
    assert_compiled_matches_eager(eager, compiled, params)
    settings = Settings().with_(cache_dir=str(tmp_path), device="cpu", speedups="vae-fp16,compile-vae")
    for parallel_vae, levers in ((True, {"vae-fp16"}), (False, {"vae-fp16", "compile-vae"})):
        layout = GroupLayout(ulysses_degree=2, parallel_vae=parallel_vae)
        assert RankEngine(settings, layout, rank=0, world=2).pipelines.speedups.levers == levers


def test_a_ring_groups_defaults_fuse_qkv_and_no_other_layouts_do():
    """``auto`` on a GPU: a ring's ranks take ``fuse-qkv`` beside the group's defaults (FLUX on a
    ring of 2 was 1.8 % faster with it, one GPU no faster); a Ulysses group, a CFG pair (SDXL's
    UNet at one row was slower with it) and a data-parallel group do not, and levers a user lists
    are theirs. On the CPU ``auto`` stays what a single worker's is."""
    from worker.group.config import GroupLayout
    from worker.group.engine import GROUP_CUDA_DEFAULT, group_speedups

    defaults = speedup_names(GROUP_CUDA_DEFAULT)
    assert "fuse-qkv" not in defaults
    ring = GroupLayout(ring_degree=2)
    assert speedup_names(group_speedups("auto", ring, cuda=True)) == defaults | {"fuse-qkv"}
    assert speedup_names(group_speedups("auto,cuda-graphs", ring, cuda=True)) == defaults | {"fuse-qkv"}
    assert speedup_names(group_speedups("auto", GroupLayout(ulysses_degree=2, ring_degree=2), cuda=True)) == (
        defaults | {"fuse-qkv"}
    )
    for other in (GroupLayout(ulysses_degree=2), GroupLayout(cfg_parallel=True), GroupLayout(data_parallel_degree=2)):
        assert speedup_names(group_speedups("auto", other, cuda=True)) == defaults
    assert group_speedups("vae-fp16,compile-blocks", ring, cuda=True) == "vae-fp16,compile-blocks"
    assert group_speedups("auto", ring, cuda=False) == "auto"


def test_fuse_qkv_fuses_a_flux_transformers_projections_and_changes_no_pixel():
    """``fuse-qkv`` on a DiT: every attention's q, k and v (and the text stream's) one product,
    read by diffusers' processors and by the groups' ring and split-decode attention alike (a
    ring rank's three products of half the rows left SMs idle); the images are the eager ones."""
    from worker.pipelines.models import build_flux
    from worker.pipelines.speedups import apply

    params = GenParams(model="tiny-flux", width=32, height=32, steps=2, guidance=3.5)
    eager = build_flux(**TINY_FLUX, t5_vocab=None, clip_vocab=None)
    fused = copy.deepcopy(eager)
    apply(fused, Speedups(frozenset({"fuse-qkv"})))
    blocks = [*fused.transformer.transformer_blocks, *fused.transformer.single_transformer_blocks]
    assert all(block.attn.fused_projections for block in blocks)
    assert all(hasattr(block.attn, "to_added_qkv") for block in fused.transformer.transformer_blocks)
    prompts, seeds = ["a red fox", "a blue jay"], [3, 4]
    reference = run_batch(eager, params, prompts, ["", ""], seeds)
    got = run_batch(fused, params, prompts, ["", ""], seeds)
    for ref, image in zip(reference.images, got.images, strict=True):
        assert np.abs(pixels(ref) - pixels(image)).max() <= 2


@pytest.mark.parametrize("kind", ["double", "single"])
def test_the_groups_attention_reads_fused_projections(kind):
    """A ring group's FLUX attention (``FluxAttentionAround``, the ring's base) under
    ``fuse-qkv``: q, k and v from the fused layer give the block's output without it."""
    from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock, FluxTransformerBlock

    from worker.group.ring_attention import FluxAttentionAround

    class Local(FluxAttentionAround):
        def attend(self, query, key, value):
            out = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (query, key, value)))
            return out.transpose(1, 2)

    torch.manual_seed(0)
    block_cls = FluxTransformerBlock if kind == "double" else FluxSingleTransformerBlock
    separate = block_cls(dim=32, num_attention_heads=2, attention_head_dim=16).eval()
    separate.attn.set_processor(Local())
    fused = copy.deepcopy(separate)
    fused.attn.fuse_projections()
    for part in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"):
        if getattr(fused.attn, part, None) is not None:  # what is read is the fused layer, not these
            getattr(fused.attn, part).weight.data.zero_()
    inputs = {
        "hidden_states": torch.randn(1, 12, 32),
        "encoder_hidden_states": torch.randn(1, 4, 32),
        "temb": torch.randn(1, 32),
        "image_rotary_emb": (torch.randn(16, 16), torch.randn(16, 16)),
    }
    with torch.no_grad():
        for want, got in zip(separate(**inputs), fused(**inputs), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_compile_vae_decodes_the_same_images_and_builds_no_graph_after_warm_up(cache_dir):
    eager = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    compiled = WarmPipelines(str(cache_dir), device="cpu", speedups="compile-vae")
    reference = job(eager, 4)
    first = job(compiled, 4)
    assert first.compiles > 0
    assert isinstance(compiled.get("tiny")[0].pipe.vae.decoder.forward, Precompiled)
    for ref, got in zip(reference.images, first.images, strict=True):
        assert np.abs(pixels(ref) - pixels(got)).max() <= 2
    assert [job(compiled, n).compiles for n in (3, 1)] == [0, 0]


def test_a_flux_batch_times_its_decode_apart_from_its_denoise():
    """A FLUX pipeline decodes itself; its batch's decode is timed at the decode's call (it was
    reported as 0 s, the decode counted as denoising), and the call is left as it was."""
    from worker.pipelines.models import build_flux

    params = GenParams(model="tiny-flux", width=32, height=32, steps=2, guidance=3.5)
    pipe = build_flux(**TINY_FLUX, t5_vocab=None, clip_vocab=None)
    pipe.vae.decoder.register_forward_pre_hook(lambda module, args: time.sleep(0.3))  # a decode of 0.3 s at least
    started = time.perf_counter()
    result = run_batch(pipe, params, ["a red fox"], [""], [3])
    took = time.perf_counter() - started
    assert "decode" not in pipe.vae.__dict__  # the call is the class's again
    assert result.decode_s >= 0.3 and 0 < result.denoise_s <= took - 0.3, result
    assert len(result.images) == 1
