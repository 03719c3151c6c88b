"""`producer enqueue` against a real redis-server: chunking, dedup, nothing half-enqueued."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from conftest import EXAMPLES, TINY_FLAGS, producer, write_csv
from rq.job import Job
from rq.serializers import JSONSerializer

from common.jobspec import JobSpec
from common.queues import get_queue, items_key
from common.settings import Settings
from producer.enqueue import EnqueueOptions, Enqueuer
from producer.reader import RowDefaults


def queued_specs(conn, queue: str = "diffq") -> list[JobSpec]:
    q = get_queue(queue, conn)
    return [JobSpec.from_dict(job.kwargs["spec"]) for job in q.get_jobs()]


def test_enqueue_chunks_rows_that_share_settings(env, conn, tmp_path):
    result = producer("enqueue", EXAMPLES / "prompts.csv", *TINY_FLAGS, "--output", tmp_path, "--chunk-size", "4")
    assert result.exit_code == 0, result.output
    assert "12 new, 0 already queued or done" in result.output
    specs = queued_specs(conn)
    assert sum(len(s.items) for s in specs) == 12
    assert all(len(s.items) <= 4 for s in specs)
    # rows with the adapter form their own chunk: a chunk never mixes settings
    assert {s.params.adapter for s in specs} == {None, "tiny-dora"}
    assert all(len({(s.params, i.id) for i in s.items}) == len(s.items) for s in specs)


def test_the_tiny_preset_defaults_to_a_size_a_cpu_makes_and_flags_and_cells_still_win(env, conn, tmp_path):
    # the docs' commands name no size: on a CPU host (DIFFQ_MODEL=tiny) SDXL's 1024² would never finish
    rows = tmp_path / "rows.csv"
    rows.write_text("prompt,width\nleft open,\na cell wins,256\n")
    assert producer("enqueue", rows, "--model", "tiny", "--output", tmp_path / "a").exit_code == 0
    sizes = {(s.params.width, s.params.height, s.params.steps) for s in queued_specs(conn)}
    assert sizes == {(128, 128, 8), (256, 128, 8)}
    conn.flushdb()
    assert (
        producer(
            "enqueue", rows, "--model", "tiny", "--steps", "3", "--width", "64", "--output", tmp_path / "b"
        ).exit_code
        == 0
    )
    assert {(s.params.width, s.params.steps) for s in queued_specs(conn)} == {(64, 3), (256, 3)}
    conn.flushdb()
    assert producer("enqueue", rows, "--model", "sdxl-random", "--output", tmp_path / "c").exit_code == 0
    assert {(s.params.width, s.params.height, s.params.steps) for s in queued_specs(conn)} == {
        (1024, 1024, 30),
        (256, 1024, 30),
    }


def test_enqueue_twice_adds_nothing(env, conn, tmp_path):
    args = ("enqueue", EXAMPLES / "prompts.csv", *TINY_FLAGS, "--output", tmp_path)
    assert producer(*args).exit_code == 0
    before = get_queue("diffq", conn).count
    again = producer(*args)
    assert again.exit_code == 0
    assert "0 new, 12 already queued or done" in again.output
    assert get_queue("diffq", conn).count == before


def test_changed_settings_are_new_work(env, conn, tmp_path):
    producer("enqueue", EXAMPLES / "prompts.csv", *TINY_FLAGS, "--output", tmp_path)
    result = producer("enqueue", EXAMPLES / "prompts.csv", *TINY_FLAGS, "--guidance", "7", "--output", tmp_path)
    assert "12 new, 0 already" in result.output


def test_bad_file_enqueues_nothing_and_names_the_rows(env, conn, tmp_path):
    bad = write_csv(tmp_path / "bad.csv", "prompt,width\nfine,64\nbroken,65\n")
    result = producer("enqueue", bad, *TINY_FLAGS)
    assert result.exit_code == 2
    assert f"{bad}:3: width 65 is not a multiple of 8" in result.output
    assert "nothing was enqueued" in result.output
    assert "Traceback" not in result.output
    assert get_queue("diffq", conn).count == 0
    assert conn.hlen(items_key("diffq")) == 0


def test_dry_run_enqueues_nothing_and_counts_the_jobs_the_enqueue_makes(env, conn, tmp_path):
    """The examples' rows are of two settings (one row has an adapter): a dry run said "about 2
    job(s)" where the enqueue made 3; it counts each setting's jobs as the enqueue chunks them."""
    result = producer("enqueue", EXAMPLES / "prompts.csv", *TINY_FLAGS, "--dry-run")
    assert result.exit_code == 0
    assert "12 rows are valid; 3 job(s)" in result.output
    assert get_queue("diffq", conn).count == 0
    assert producer("enqueue", EXAMPLES / "prompts.csv", *TINY_FLAGS, "--output", tmp_path).exit_code == 0
    assert get_queue("diffq", conn).count == 3


def test_jobs_are_json_with_a_readable_description(env, conn, tmp_path):
    producer("enqueue", EXAMPLES / "prompts.csv", *TINY_FLAGS, "--output", tmp_path)
    job_id = get_queue("diffq", conn).job_ids[0]
    raw = conn.hget(Job.key_for(job_id), "data")
    import zlib

    payload = json.loads(zlib.decompress(raw))  # RQ compresses; JSON underneath, never pickle
    assert payload[0] == "worker.task.run_job"
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    assert "lighthouse" in job.description and "64x64" in job.description


def test_unreachable_redis_is_one_line(env, tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://:secret@127.0.0.1:1/0")
    result = producer("enqueue", EXAMPLES / "prompts.csv", *TINY_FLAGS)
    assert result.exit_code == 2
    assert "cannot reach Redis at redis://:***@127.0.0.1:1/0" in result.output
    assert "secret" not in result.output and "Traceback" not in result.output


def _enqueue_peak(conn, path, rows: int) -> int:
    path.write_text("prompt\n" + "".join(f"prompt number {i}\n" for i in range(rows)))
    conn.flushall()
    tracemalloc.start()
    options = EnqueueOptions.from_settings(Settings().with_(chunk_size=4), "/tmp/out")
    Enqueuer(conn, "diffq", options).enqueue(path, RowDefaults(model="tiny"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


@pytest.mark.long  # a scale check; make test enqueues, resumes and races producers
def test_enqueue_streams_memory_does_not_grow_with_the_file(conn, tmp_path):
    # five times the rows; memory that grew with them would be ~5x here (tracemalloc makes each
    # row slow, so the files stay small enough for the quick tier)
    small = _enqueue_peak(conn, tmp_path / "small.csv", 2_000)
    large = _enqueue_peak(conn, tmp_path / "large.csv", 10_000)
    assert get_queue("diffq", conn).count == 10_000 // 4
    assert large < 1.5 * small, (small, large)


def test_enqueue_survives_redis_losing_its_scripts_between_load_and_run(env, conn, tmp_path, monkeypatch):
    """Finding 6: redis-py loads a pipeline's scripts, then runs it; a Redis that restarted in
    between has an empty script cache and answers NoScriptError (a traceback, before). The
    restart's effect is made exactly: the real script cache of the real server is flushed there."""
    import redis.client

    real_load = redis.client.Pipeline.load_scripts
    flushed = []

    def load_then_lose(self):  # the restart lands between SCRIPT LOAD and the pipeline's EVALSHAs
        real_load(self)
        if len(flushed) < 2:
            flushed.append(1)
            redis.Redis(connection_pool=self.connection_pool).script_flush()

    monkeypatch.setattr(redis.client.Pipeline, "load_scripts", load_then_lose)
    rows = write_csv(tmp_path / "p.csv", "prompt\n" + "".join(f"restart {i}\n" for i in range(6)))
    result = producer("enqueue", rows, *TINY_FLAGS, "--output", tmp_path / "out", "--chunk-size", "2")
    assert result.exit_code == 0, result.output
    assert len(flushed) == 2 and "6 new" in result.output
    assert sum(len(s.items) for s in queued_specs(conn)) == 6 and conn.hlen(items_key("diffq")) == 6


def test_a_flag_that_rows_own_cells_override_is_said_once_with_the_count(env, conn, tmp_path):
    """``--num-images 2`` on the examples made one image per prompt and said nothing: their
    ``num_images`` column wins. The rule stays (a cell wins); the enqueue says it, once per flag."""
    result = producer("enqueue", EXAMPLES / "prompts.csv", *TINY_FLAGS, "--num-images", "2", "--seed", "5", "--dry-run")
    assert result.exit_code == 0
    notes = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert len(notes) == 2, result.output
    assert "note: --num-images is for rows without a num_images cell; 12 of 12 row(s) have their own" in notes[0]
    assert "note: --seed is for rows without a seed cell;" in notes[1] and " of 12 row(s)" in notes[1]
    quiet = producer("enqueue", EXAMPLES / "prompts.csv", *TINY_FLAGS, "--dry-run")
    assert "note:" not in quiet.output  # the flags the command did not give are not said
