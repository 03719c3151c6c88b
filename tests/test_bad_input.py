"""Bad input, one case each (the table in docs/reliability.md): the real ``producer enqueue``
against a real Redis, a clear message naming the file and row, exit code 2, nothing enqueued.

Every file has a good row first, so "nothing enqueued" means the bad row stopped the good one too.
"""

from __future__ import annotations

import pytest
from conftest import TINY_FLAGS, producer

CASES = [
    # (name, file name, bytes, expected message after "<path>")
    ("empty file", "p.csv", b"", ": empty file; expected a header row with a 'prompt' column"),
    ("no prompt column", "p.csv", b"caption\nx\n", ":1: no 'prompt' column (found 'caption')"),
    ("unknown column", "p.csv", b"prompt,colour\nx,red\n", ":1: unknown column(s) 'colour'"),
    ("wrong type", "p.csv", b"prompt,width\nok,64\nx,abc\n", ":3: width 'abc' is not a whole number"),
    ("wrong JSON type", "p.jsonl", b'{"prompt": "ok"}\n{"prompt": 5}\n', ":2: prompt must be text, not int"),
    ("negative size", "p.csv", b"prompt,width\nok,64\nx,-64\n", ":3: width -64 is outside 64..4096"),
    ("huge size", "p.csv", b"prompt,height\nok,64\nx,100000\n", ":3: height 100000 is outside 64..4096"),
    ("steps 0", "p.csv", b"prompt,steps\nok,3\nx,0\n", ":3: steps 0 is outside 1..500"),
    ("NaN guidance", "p.csv", b"prompt,guidance\nok,5\nx,nan\n", ":3: guidance must be a finite number, not nan"),
    (
        "NaN guidance (JSONL)",
        "p.jsonl",
        b'{"prompt": "ok"}\n{"prompt": "x", "guidance": NaN}\n',
        ":2: guidance must be a finite number, not nan",
    ),
    (
        "100 kB prompt",
        "p.csv",
        b"prompt\nok\n" + b"a" * 100_000 + b"\n",
        ":3: prompt is 100000 characters long (at most 4000)",
    ),
    ("NUL byte", "p.csv", b"prompt\nok\na\x00b\n", ":3: row contains a NUL byte"),
    ("broken UTF-8", "p.csv", b"prompt\nok\ncaf\xe9\n", ":3: prompt is not valid UTF-8"),
    ("ragged row", "p.csv", b"prompt,seed\nok,1\nx,2,3\n", ":3: row has 3 fields but the header has 2"),
    ("JSONL non-object", "p.jsonl", b'{"prompt": "ok"}\n[1, 2]\n', ":2: expected a JSON object, got list"),
    ("JSONL broken JSON", "p.jsonl", b'{"prompt": "ok"}\n{"prompt": \n', ":2: not valid JSON"),
    (
        "duplicate id, other content",
        "p.csv",
        b"id,prompt\na,cat\na,dog\n",
        ":3: id 'a' is also on line 2 with other content",
    ),
]


@pytest.mark.parametrize(("name", "filename", "data", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_message_and_enqueues_nothing(env, conn, tmp_path, name, filename, data, message):
    path = tmp_path / filename
    path.write_bytes(data)
    result = producer("enqueue", path, *TINY_FLAGS, "--output", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert f"error: {path}{message}" in result.output
    assert "Traceback" not in result.output
    assert conn.dbsize() == 0, "something was enqueued"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["the folder", "a parent"])
def test_an_output_that_is_a_file_is_refused_at_enqueue(env, conn, tmp_path, where):
    """Workers would pause on it one by one (`'…/afile' is not writable: File exists`), valid
    jobs queued behind it included: the producer says so instead, and queues nothing."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    rows = tmp_path / "p.csv"
    rows.write_text("prompt\na fox\n", encoding="utf-8")
    output = afile if where == "the folder" else afile / "out"
    result = producer("enqueue", rows, *TINY_FLAGS, "--output", output)
    assert result.exit_code == 2
    said = "is a file" if where == "the folder" else f"cannot be made: {afile} is a file"
    expected = f"error: --output '{output}' {said}; give a folder; nothing was enqueued"
    assert result.output.strip().splitlines()[-1] == expected
    assert conn.dbsize() == 0


def _safetensors(path, keys: list[str]) -> None:
    """A safetensors file with ``keys`` (header only matters: the producer reads nothing else)."""
    import json
    import struct

    header = {k: {"dtype": "F16", "shape": [1], "data_offsets": [2 * i, 2 * i + 2]} for i, k in enumerate(keys)}
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0\0" * len(keys))


@pytest.mark.parametrize(
    ("name", "cell", "reason"),
    [
        ("a system file", "/etc/passwd", "passwd is not a .safetensors file"),
        ("a relative path out of the folder", "../../../../../../../../etc/passwd", "passwd is not a .safetensors"),
        ("safetensors without LoRA keys", "{tmp}/model.safetensors", "model.safetensors holds no LoRA/DoRA weights"),
        ("not safetensors inside", "{tmp}/fake.safetensors", "fake.safetensors is not a safetensors file"),
        ("a folder without weights", "{tmp}", "is a folder with no .safetensors file"),
    ],
)
def test_an_adapter_that_is_not_a_lora_file_is_refused_with_its_row(env, conn, tmp_path, monkeypatch, name, cell,
                                                                      reason):  # fmt: skip
    """Finding 4: any file that existed was taken for an adapter (``/etc/passwd`` too)."""
    _safetensors(tmp_path / "model.safetensors", ["down_blocks.0.weight"])
    (tmp_path / "fake.safetensors").write_bytes(b"\xff" * 64)
    empty = tmp_path / "empty"
    empty.mkdir()
    rows = tmp_path / "p.csv"
    cell = cell.format(tmp=empty if name == "a folder without weights" else tmp_path)
    rows.write_text(f"prompt,adapter\nok,\nx,{cell}\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    result = producer("enqueue", rows, *TINY_FLAGS, "--output", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert f"error: {rows}:3: adapter " in result.output and reason in result.output, result.output
    assert "Traceback" not in result.output
    assert conn.dbsize() == 0, "something was enqueued"


def test_an_adapter_path_is_stored_absolute_and_a_relative_one_without_checks_is_refused(env, conn, tmp_path,
                                                                                         monkeypatch):  # fmt: skip
    """Each worker resolved a relative path against its own folder: the job now names the file."""
    from rq.job import Job
    from rq.serializers import JSONSerializer

    from common.queues import get_queue

    lora = tmp_path / "loras" / "style.safetensors"
    lora.parent.mkdir()
    _safetensors(lora, ["unet.down.to_q.lora_A.weight", "unet.down.to_q.lora_B.weight"])
    rows = tmp_path / "p.csv"
    rows.write_text("prompt,adapter\nx,loras/style.safetensors\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert producer("enqueue", rows, *TINY_FLAGS, "--output", tmp_path / "out").exit_code == 0
    (job_id,) = get_queue("diffq", conn).job_ids
    spec = Job.fetch(job_id, connection=conn, serializer=JSONSerializer).kwargs["spec"]
    assert spec["params"]["adapter"] == str(lora)
    conn.flushdb()
    result = producer("enqueue", rows, *TINY_FLAGS, "--output", tmp_path / "out", "--no-path-checks")
    assert result.exit_code == 2 and f"{rows}:2: adapter 'loras/style.safetensors' is a relative path" in (
        result.output
    ), result.output
    assert conn.dbsize() == 0
