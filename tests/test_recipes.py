"""Few-step recipes (``--recipe``, a ``recipe`` column): a distilled model's steps, guidance,
sampler, spacing and size set together; a row's cells and the flags still win; a known few-step
adapter or model run against its recipe is said at enqueue, row by row."""

from __future__ import annotations

import shutil

from conftest import producer, write_csv
from rq.job import Job
from rq.serializers import JSONSerializer

from common.queues import get_queue
from common.recipes import RECIPES


def queued_params(conn) -> list[dict]:
    queue = get_queue("diffq", conn)
    jobs = Job.fetch_many(queue.get_job_ids(), connection=conn, serializer=JSONSerializer)
    return [job.kwargs["spec"]["params"] for job in jobs]


def test_a_recipe_sets_a_few_step_models_settings_and_cells_and_flags_still_win(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt,steps\na fox,\na bird,8\n")
    said = producer("enqueue", rows, "--model", "sdxl-random", "--recipe", "sdxl-lightning-4", "--width", "768",
                    "--output", tmp_path / "out", "--dry-run")  # fmt: skip
    assert said.exit_code == 0, said.output
    assert producer("enqueue", rows, "--model", "sdxl-random", "--recipe", "sdxl-lightning-4", "--width", "768",
                    "--output", tmp_path / "out").exit_code == 0  # fmt: skip
    params = sorted(queued_params(conn), key=lambda p: p["steps"])
    assert [(p["steps"], p["guidance"], p["sampler"], p["timestep_spacing"]) for p in params] == [
        (4, 0.0, "euler", "trailing"),  # the recipe's
        (8, 0.0, "euler", "trailing"),  # the row's cell wins
    ]
    assert {(p["width"], p["height"]) for p in params} == {(768, 1024)}  # the flag wins, the recipe's height


def test_a_recipe_column_picks_one_per_row_and_an_unknown_one_is_its_row_and_the_list(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt,recipe\na fox,dmd2-4\na bird,sdxl-turbo\na cat,sdxl-lightening-4\n")
    said = producer("enqueue", rows, "--model", "sdxl-random", "--output", tmp_path / "out")
    assert said.exit_code == 2 and f"p.csv:4: unknown recipe 'sdxl-lightening-4'; use one of {', '.join(RECIPES)}" \
        in said.output, said.output  # fmt: skip
    assert not conn.keys("rq:job:*")  # nothing half-enqueued
    write_csv(rows, "prompt,recipe\na fox,dmd2-4\na bird,sdxl-turbo\n")
    assert producer("enqueue", rows, "--model", "sdxl-random", "--output", tmp_path / "out").exit_code == 0
    params = {p["steps"]: p for p in queued_params(conn)}
    assert params[4]["sampler"] == "lcm" and params[1]["sampler"] == "euler-a" and params[1]["width"] == 512
    bad = producer("enqueue", rows, "--model", "sdxl-random", "--recipe", "lightning")
    assert bad.exit_code == 2 and "--recipe: unknown recipe 'lightning'" in bad.output, bad.output


def test_a_known_few_step_adapter_or_model_run_against_its_recipe_is_said_at_enqueue(env, conn, tmp_path, cache_dir):
    """SDXL-Lightning's LoRA at 30 steps, CFG 5 and the default sampler "works" and makes wrong
    images: the producer names the row, what it recognised and the recipe to use."""
    from worker.pipelines.models import ensure_tiny_dora

    source = next(ensure_tiny_dora(cache_dir).rglob("*.safetensors"))
    adapter = tmp_path / "sdxl_lightning_4step_lora.safetensors"
    shutil.copy(source, adapter)
    rows = write_csv(tmp_path / "p.csv", f"prompt,adapter,steps\na fox,{adapter},30\na bird,{adapter},4\n")
    said = producer("enqueue", rows, "--model", "tiny", "--output", tmp_path / "out")
    assert said.exit_code == 0, said.output  # said, not refused: the user may mean it
    assert "p.csv:2: adapter 'sdxl_lightning_4step_lora.safetensors' looks like SDXL-Lightning 4-step" in said.output
    assert "steps 30 (its recipe: 4)" in said.output and "--recipe sdxl-lightning-4" in said.output
    assert "p.csv:3:" in said.output  # 4 steps, but guidance 5 and the model's own sampler
    model = producer("enqueue", write_csv(tmp_path / "q.csv", "prompt\nx\n"), "--model",
                     "black-forest-labs/FLUX.1-schnell", "--steps", "30", "--dry-run")  # fmt: skip
    assert "looks like FLUX.1-schnell" in model.output and "--recipe flux-schnell" in model.output, model.output
    quiet = producer("enqueue", rows, "--model", "tiny", "--recipe", "sdxl-lightning-4", "--output", tmp_path / "o2")
    assert quiet.exit_code == 0 and "warning" not in quiet.output, quiet.output  # the recipe was asked for
