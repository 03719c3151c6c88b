"""Bare latency of one group's parallel pipeline, under torchrun, without Redis.

Every rank builds the same :class:`worker.group.engine.RankEngine` the group worker uses (so
the split is the real one: our CFG parallel for SDXL; for FLUX diffusers' Ulysses or ring alone,
xDiT's otherwise) and calls
its ``run`` in lockstep; rank 0 times each call between barriers. One JSON line per batch size
goes to ``--out``; rank 0 also saves the first batch's images as ``--save`` (for equality checks) and
compares them with ``--compare`` when given.

    torchrun --nproc-per-node 4 bench/group.py --model flux-random --ulysses-degree 4 --out g.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="flux-random")
    ap.add_argument("--ulysses-degree", type=int, default=1)
    ap.add_argument("--ring-degree", type=int, default=1)
    ap.add_argument("--pipefusion-degree", type=int, default=1)
    ap.add_argument("--cfg-parallel", action="store_true")
    ap.add_argument("--data-parallel-degree", type=int, default=1)
    ap.add_argument("--parallel-vae", action="store_true", help="xDiT's DistVAE: every rank decodes a slice")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--guidance", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--out", required=True)
    ap.add_argument("--save", help="rank 0 writes the first batch's images here (.npy)")
    ap.add_argument("--compare", help="a .npy of images to compare the first batch's with")
    ap.add_argument("--label", default="")
    ap.add_argument(
        "--cudagraphs",
        action="store_true",
        help="experiment: the whole-graph levers compile lazily with mode=reduce-overhead (the compiler's CUDA "
        "graphs), no precompiled files; the product's lever is cuda-graphs (worker/pipelines/step_graphs.py)",
    )
    ap.add_argument(
        "--graph-steps",
        action="store_true",
        help="experiment: every denoiser call replays one hand-captured CUDA graph (bench/step_graph.py)",
    )
    ap.add_argument(
        "--comm-overlap",
        action="store_true",
        help="experiment: Inductor moves each compiled graph's collectives and waits to overlap compute "
        "(reorder_for_compute_comm_overlap with its three passes: torch 2.13 runs none by default); acts only "
        "where a block's graph holds them",
    )
    ap.add_argument(
        "--xdit",
        action="store_true",
        help="split FLUX's Ulysses-only layout with xDiT, as the product did before 2026-11-27 (the comparison)",
    )
    ap.add_argument(
        "--cp-chunks",
        type=int,
        default=0,
        help="experiment, on diffusers' Ulysses split: our attention exchange in this many parts of the heads, "
        "overlapped with attention (bench/context_parallel.py)",
    )
    ap.add_argument(
        "--overlap",
        action="store_true",
        help="experiment, on diffusers' Ulysses split: the single-stream blocks' exchanges overlapped with "
        "their MLP (bench/context_parallel.py)",
    )
    ap.add_argument(
        "--attention",
        help="experiment: the transformer's diffusers attention backend (e.g. _native_flash, _native_cudnn), on "
        "one GPU and in a group (set after the group's split, over the one it chose)",
    )
    ap.add_argument(
        "--no-overlap-gather",
        action="store_true",
        help="experiment, on a ring: Inductor's default order (the peers' keys and values gathered after the "
        "local attention), not the product's",
    )
    ap.add_argument(
        "--diffusers-ring",
        action="store_true",
        help="a ring group attends with diffusers' ring (TemplatedRingAttention, its _native_cudnn backend), as "
        "the product did before 2026-11-28, not worker/group/ring_attention.py (the comparison)",
    )
    ap.add_argument(
        "--whole-decode",
        action="store_true",
        help="A/B: no decode split by rows (worker/group/split_decode.py): every rank of a Ulysses or ring group "
        "decodes the whole latent (the product before 2026-11-28), and an SDXL CFG pair decodes an odd batch's "
        "last image whole on both ranks (before 2026-11-29)",
    )
    ap.add_argument(
        "--ring-bshd",
        action="store_true",
        help="experiment, on a ring: cuDNN handed views of the tokens-first memory, not the product's copies into "
        "its heads-first layout (bench/ring_bshd.py)",
    )
    ap.add_argument(
        "--ring-whole",
        action="store_true",
        help="experiment, on a ring: one attention over every rank's keys after the gather, no merge "
        "(bench/ring_whole.py), not the product's local attention, peers' and merge",
    )
    ap.add_argument(
        "--ring-torch-merge",
        action="store_true",
        help="A/B, on a ring: the last merge of the attentions in torch ops, which the compiler fuses into the "
        "kernel after the attention, as the product did before 2026-11-28's merge kernel "
        "(worker/group/attention_merge.py)",
    )
    ap.add_argument(
        "--pull-gather",
        action="store_true",
        help="experiment, on a ring: the peers' keys and values pulled by the copy engines (bench/peer_gather.py), "
        "not gathered by NCCL's all-gather (the product's)",
    )
    ap.add_argument("--profile", type=Path, help="one more call of the first batch size under torch.profiler")
    ap.add_argument(
        "--alternate-pinned",
        action="store_true",
        help="odd calls with the pipeline's device looked up by diffusers on every ask, as before 2026-11-29, even "
        "calls with it pinned (the product's, worker/pipelines/pinned_device.py); both kinds recorded",
    )
    ap.add_argument(
        "--alternate-rounding",
        action="store_true",
        help="odd calls with a FLUX image's pixels rounded on the host as diffusers' PIL output does, as before "
        "2026-11-29, even calls rounded on the device (the product's, worker/pipelines/pixels.py); both recorded",
    )
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    from common.settings import Settings
    from worker.group.comm import init_world, local_rank
    from worker.group.config import GroupLayout
    from worker.group.engine import RankEngine
    from worker.pipelines import pinned_device
    from worker.pipelines.families import flux as flux_family

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank())
    if args.cudagraphs:
        import worker.pipelines.speedups as speedups

        os.environ["DIFFQ_PRECOMPILE"] = "0"
        speedups._compile_lazily = lambda module: module.compile(fullgraph=True, dynamic=False, mode="reduce-overhead")
        # a DiT's blocks too: each graph between xDiT's all-to-alls is replayed as one CUDA graph
        from diffusers.models.modeling_utils import ModelMixin

        regional = ModelMixin.compile_repeated_blocks
        ModelMixin.compile_repeated_blocks = lambda self, **kw: regional(self, **{**kw, "mode": "reduce-overhead"})
    if args.comm_overlap:
        import torch._inductor.config as inductor_config

        inductor_config.reorder_for_compute_comm_overlap = True
        # on 2 CPU ranks these put a FLUX single block's MLP between its last all-to-all and the wait
        inductor_config.reorder_for_compute_comm_overlap_passes = [
            "reorder_compute_for_overlap",
            "sink_waits",
            "raise_comms",
        ]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    layout = GroupLayout(
        ulysses_degree=args.ulysses_degree,
        ring_degree=args.ring_degree,
        pipefusion_degree=args.pipefusion_degree,
        cfg_parallel=args.cfg_parallel,
        data_parallel_degree=args.data_parallel_degree,
        parallel_vae=args.parallel_vae,
        timeout_s=600,
    )
    layout.check_world(world)
    init_world("nccl" if cuda else "gloo", 600)
    engine = RankEngine(Settings.load(), layout, rank, world)
    started = time.perf_counter()
    engine.load(args.model)
    dist.barrier()
    from worker.group import token_split

    if args.xdit:
        token_split.takes = lambda _layout: None  # the engine's other FLUX branch: xDiT
    if args.no_overlap_gather:
        token_split._overlap_gathers = lambda: None
    if args.diffusers_ring:
        token_split._ring_attention = lambda pipe: pipe.transformer.set_attention_backend("_native_cudnn") or ""
    if args.whole_decode:
        from worker.group import split_decode

        split_decode.install = lambda vae, group: False
    if args.ring_bshd:
        import ring_bshd

        ring_bshd.use()
    if args.ring_whole:
        import ring_whole

        ring_whole.use()
    if args.ring_torch_merge:
        from worker.group import attention_merge, ring_attention

        ring_attention.merge_last = attention_merge.reference
    engine.split()
    if args.pull_gather:
        import peer_gather

        if not peer_gather.use(engine.loaded.pipe):
            raise SystemExit("--pull-gather: this group has no ring attention (use --ring-degree)")
    if args.attention:
        engine.loaded.pipe.transformer.set_attention_backend(args.attention)
    way = engine.token_split[0] if engine.token_split else None
    if (args.cp_chunks or args.overlap) and way != "ulysses":
        raise SystemExit("--cp-chunks and --overlap change diffusers' Ulysses split: FLUX, --ulysses-degree only")
    flux = "Flux" in type(engine.loaded.pipe).__name__
    split = f"diffusers, {way}" if way else "xdit" if flux and layout.model_parallel else "diffq"
    split += f", attention {args.attention}" if args.attention else ""
    split += ", gather not overlapped" if way == "ring" and args.no_overlap_gather else ""
    split += ", diffusers' ring" if way == "ring" and args.diffusers_ring else ""
    split += ", peers pulled by the copy engines" if args.pull_gather else ""
    split += ", tokens-first views" if args.ring_bshd else ""
    split += ", one attention over all keys" if args.ring_whole else ""
    split += ", the last merge in torch ops" if args.ring_torch_merge else ""
    split += ", whole decode" if args.whole_decode else ""
    if way:
        if args.cp_chunks:
            from context_parallel import exchange_in_parts

            exchange_in_parts(engine.loaded.pipe, args.ulysses_degree, args.cp_chunks)
            split = f"diffusers, our exchange in {args.cp_chunks} parts"
        if args.overlap:
            compiled = "compile-blocks" in engine.loaded.speedups
            from context_parallel import overlap_exchanges

            blocks = overlap_exchanges(engine.loaded.pipe, compiled=compiled)
            split = f"diffusers, {blocks} single-stream blocks overlapped" + (" (compiled pieces)" if compiled else "")
    load_s = time.perf_counter() - started
    graphs = None
    if args.graph_steps:
        from step_graph import install

        pipe = engine.loaded.pipe
        graphs = install(pipe.transformer if getattr(pipe, "transformer", None) is not None else pipe.unet)
    import numpy as np

    # --alternate-*: (the even calls' name, the odd calls', what sets a call's kind given "odd")
    alternation = None
    if args.alternate_pinned:
        alternation = (
            "pinned",
            "unpinned",
            lambda odd: (pinned_device.unpin if odd else pinned_device.pin)(engine.loaded.pipe),
        )
    elif args.alternate_rounding:
        from diffusers.image_processor import VaeImageProcessor

        on_device = flux_family.rounded_pil

        def on_host(image):  # what postprocess(output_type="pil") does after denormalizing
            return VaeImageProcessor.numpy_to_pil(VaeImageProcessor.pt_to_numpy(image))

        alternation = (
            "device_rounding",
            "host_rounding",
            lambda odd: setattr(flux_family, "rounded_pil", on_host if odd else on_device),
        )
    for batch in [int(b) for b in args.batches.split(",")]:
        work = {
            "params": {"model": args.model, "width": args.size, "height": args.size, "steps": args.steps,
                       "guidance": args.guidance, "adapter": None, "adapter_scale": 1.0},
            "prompts": [f"benchmark prompt {i}, a red fox in snow" for i in range(batch)],
            "negatives": [""] * batch,
            "seeds": [1000 + i for i in range(batch)],
            "max_batch": batch,
        }  # fmt: skip
        times: list[float] = []
        odd_times: list[float] = []  # an --alternate-* flag's odd calls
        outside: dict[bool, list[float]] = {False: [], True: []}  # a call's time beyond its phases, by oddness
        decodes: dict[bool, list[float]] = {False: [], True: []}  # its decode phase
        first_call_s = 0.0
        answer = None
        for run in range(args.runs + 1):  # the first call warms up kernels and is not counted
            odd = alternation is not None and run % 2 == 1
            if alternation is not None:
                alternation[2](odd)
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            answer = engine.run(work)
            sync()
            dist.barrier()
            if run:
                took = time.perf_counter() - t0
                (odd_times if odd else times).append(took)
                outside[odd].append(took - sum((answer.timings or {}).values()))
                decodes[odd].append((answer.timings or {}).get("decode_s", 0.0))
            else:
                first_call_s = time.perf_counter() - t0  # kernels, and the compile when one is on
            if answer.error:
                raise SystemExit(answer.error)
        holder_images = answer.images if answer is not None else None
        peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0])
        if cuda:
            peak = peak.cuda()
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)  # the fullest rank's (under DistVAE every rank decodes)
        record = {
            "t": round(time.time(), 1),
            "kind": "group-bare",
            "label": args.label,
            "model": args.model,
            "gpus": world,
            "gpu": torch.cuda.get_device_name() if cuda else "cpu",
            "layout": layout.arithmetic(),
            "batch": batch,
            "steps": args.steps,
            "size": args.size,
            "s_per_call": round(min(times), 4),
            "calls": [round(t, 4) for t in times],
            "s_per_img": round(min(times) / batch, 4),
            # rank 0's encode / denoise / decode in the last call (each phase ends with a sync)
            "phases": {k: round(v, 4) for k, v in (answer.timings or {}).items()} if answer is not None else None,
            "load_s": round(load_s, 1),
            "first_call_s": round(first_call_s, 1),
            "speedups": os.environ.get("DIFFQ_SPEEDUPS", "auto"),
            "peak_gib": round(float(peak.item()), 2) if cuda else None,
            "parallel_vae": args.parallel_vae,
            "graph_steps": graphs.replays if graphs is not None else None,
            "product_graphs": engine.graphs_hold_collectives,
            "comm_overlap": args.comm_overlap,
            "split": split,
            "torch": torch.__version__,
        }
        if alternation is not None:
            even_name, odd_name, _ = alternation
            for name, odd, calls in ((even_name, False, times), (odd_name, True, odd_times)):
                record[name] = {
                    "s_per_img": round(min(calls) / batch, 4),
                    "calls": [round(t, 4) for t in calls],
                    "outside_phases_s": [round(t, 4) for t in outside[odd]],
                    "decode_s": [round(t, 4) for t in decodes[odd]],
                }
        # the images live on the rank that holds them; bring them to rank 0 (the first batch's all
        # of them are saved and compared: under CFG parallel each rank decodes half of them)
        box = [np.stack(holder_images) if holder_images else None]
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(box[0], gathered, dst=0)
        if rank == 0:
            first = next((g for g in gathered or [] if g is not None), None)
            if first is not None:
                record["image_finite_mean"] = round(float(np.asarray(first, dtype=np.float64).mean()), 2)
                first_batch = batch == int(args.batches.split(",")[0])
                if first_batch and args.save:
                    np.save(args.save, first)
                if first_batch and args.compare and Path(args.compare).exists():
                    ref = np.load(args.compare).astype(np.int16)
                    diff = np.abs(ref - np.asarray(first, dtype=np.int16))
                    record["max_pixel_diff_255"] = int(diff.max())
                    record["max_pixel_diff"] = round(int(diff.max()) / 255, 4)
                    record["mean_pixel_diff_255"] = round(float(diff.mean()), 3)
            print(json.dumps(record), flush=True)
            with open(args.out, "a") as fh:
                fh.write(json.dumps(record) + "\n")
        if args.profile is not None and batch == int(args.batches.split(",")[0]):
            from rank_profile import profile_call

            dist.barrier()
            summary = profile_call(lambda work=work: engine.run(work), engine.loaded.pipe, rank, args.profile)
            summaries = [None] * world if rank == 0 else None
            dist.gather_object(summary, summaries, dst=0)
            if rank == 0:
                line = {"kind": "group-profile", "label": args.label, "gpus": world, "layout": layout.arithmetic(),
                        "batch": batch, "size": args.size, "steps": args.steps, "gpu": record["gpu"],
                        "torch": torch.__version__, "ranks": summaries}  # fmt: skip
                print(json.dumps(line), flush=True)
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(line) + "\n")
    dist.barrier()
    if cuda:  # a graph that captured collectives holds NCCL's communicators: drop it first (the product's too)
        from worker.pipelines import step_graphs

        torch.cuda.synchronize()
        step_graphs.release(engine.loaded.pipe)
    dist.destroy_process_group()
    if rank == 0:
        print(f"rank 0: process group destroyed at {time.time():.1f}", flush=True)


if __name__ == "__main__":
    main()
