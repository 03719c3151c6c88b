"""``producer verify`` and ``--repair`` against a real redis-server, real worker processes and
moto's S3 server: every kind of damage is found, repaired, and the output verifies clean with
every image once and one line each."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_FLAGS, assert_exactly_once, images_under, producer, run_worker, write_csv

from common.queues import images_key

pytestmark = pytest.mark.slow


def campaign(env, tmp_path, n: int, output: str, extra: tuple[str, ...] = ()) -> None:
    rows = write_csv(tmp_path / "p.csv", "prompt\n" + "".join(f"verify prompt {i}\n" for i in range(n)))
    assert producer("enqueue", rows, *TINY_FLAGS, "--chunk-size", "2", "--output", output).exit_code == 0
    done = run_worker({**env, **dict(extra)})
    assert done.returncode == 0, done.stderr


def test_verify_finds_every_kind_of_damage_and_repair_leaves_a_clean_output(env, conn, tmp_path):
    out = tmp_path / "out"
    campaign(env, tmp_path, 8, str(out))
    clean = producer("verify", out)
    assert clean.exit_code == 0 and "8 done item(s), 8 image(s), 8 metadata line(s)" in clean.output, clean.output
    assert "clean: the output equals the ledger" in clean.output

    meta = out / "metadata.jsonl"
    lines = meta.read_text().splitlines()
    images = images_under(out)
    images[0].unlink()  # an image gone, its line stays
    images[1].write_bytes(images[1].read_bytes()[:100])  # an image cut short
    by_name = {json.loads(line)["file_name"]: line for line in lines}
    no_line = str(images[2].relative_to(out))
    kept = [line for line in lines if json.loads(line)["file_name"] != no_line]  # a line gone
    meta.write_text("\n".join([*kept, kept[3], '{"file_name": "images/ab/fragm']) + "\n")  # repeated, fragment

    found = producer("verify", out)
    assert found.exit_code == 1, found.output
    for words in (
        "2 image(s) of done items missing (or not whole)",
        "1 image(s) of done items with no metadata line",
        "1 metadata line(s) repeating an image's line",
        "1 metadata line(s) that are not a whole record",
        "--repair",
    ):
        assert words in found.output, found.output
    assert by_name[no_line]  # (the line we removed was a real one)

    fixed = producer("verify", out, "--repair")
    assert fixed.exit_code == 0, fixed.output
    assert "2 item(s) queued again" in fixed.output and "1 metadata line(s) rebuilt from their images" in fixed.output
    assert int(conn.get(images_key("diffq"))) == 6  # the two being remade are not counted as written
    after = producer("verify", out)
    assert after.exit_code == 0 and "2 in flight" in after.output, after.output

    assert run_worker(env).returncode == 0
    assert_exactly_once(out, 8)
    final = producer("verify", out)
    assert final.exit_code == 0 and "clean" in final.output and "8 image(s), 8 metadata line(s)" in final.output
    assert int(conn.get(images_key("diffq"))) == 8
    records = [json.loads(line) for line in meta.read_text().splitlines()]
    rebuilt = next(r for r in records if r["file_name"] == no_line)
    conn.incrby(images_key("diffq"), 3)  # a count ahead of the disk (a ledger from before 2026-11-25)
    ahead = producer("verify", out)
    assert ahead.exit_code == 1 and "3 images counted as written that are not on disk" in ahead.output, ahead.output
    assert producer("verify", out, "--repair").exit_code == 0
    assert int(conn.get(images_key("diffq"))) == 8
    had = json.loads(by_name[no_line])
    assert rebuilt == {k: v for k, v in had.items() if k != "timings"}  # the image's own chunk: all but timings


@pytest.mark.long
@pytest.mark.soak
def test_verify_and_repair_an_s3_output_that_lost_images_lines_and_parts(env, conn, tmp_path, s3_server, bucket):
    url = f"s3://{bucket}/out"
    campaign(env, tmp_path, 6, url, tuple(s3_server.env().items()))
    assert producer("verify", url).exit_code == 0
    s3 = s3_server.client()
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]]
    pngs = sorted(k for k in keys if k.endswith(".png"))
    parts = sorted(k for k in keys if "/metadata/" in k)
    s3.delete_object(Bucket=bucket, Key=pngs[0])  # an image lost
    s3.delete_object(Bucket=bucket, Key=parts[-1])  # a part (two lines) lost
    found = producer("verify", url)
    assert found.exit_code == 1 and "missing" in found.output, found.output
    fixed = producer("verify", url, "--repair")
    assert fixed.exit_code == 0, fixed.output
    assert run_worker({**env, **s3_server.env()}).returncode == 0
    final = producer("verify", url)
    assert final.exit_code == 0 and "6 image(s), 6 metadata line(s)" in final.output, final.output
    assert int(conn.get(images_key("diffq"))) == 6


def test_verify_says_what_it_cannot_check(env, conn, tmp_path):
    missing = producer("verify", tmp_path / "nowhere")
    assert missing.exit_code == 2 and "no such folder" in missing.output
    assert "Traceback" not in missing.output


@pytest.mark.long
def test_verify_returns_under_a_signal_handler_that_returns(env, conn, tmp_path, redis_url):
    """Its checking processes are forked: a caller's SIGTERM handler that only sets a flag (as
    RQ's worker installs one) used to make a child survive the pool's SIGTERM while it waited
    on a lock the parent held, and verify hung (seen in a suite run beside another)."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    out = tmp_path / "out"
    campaign(env, tmp_path, 4, str(out))
    script = (
        "import signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda *_: None)\n"
        "from click.testing import CliRunner\n"
        "from producer.cli import main\n"
        "for _ in range(25):\n"
        "    r = CliRunner().invoke(main, ['verify', sys.argv[1], '--redis-url', sys.argv[2]])\n"
        "    assert r.exit_code == 0, r.output\n"
        "print('25 verify runs')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(out), redis_url],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its forked children too go with a kill of the group
    )
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # SIGKILL: the handler ignores SIGTERM
        proc.communicate()
        raise AssertionError("producer verify hung under a SIGTERM handler that returns") from None
    assert proc.returncode == 0 and "25 verify runs" in stdout, stderr[-2000:]
