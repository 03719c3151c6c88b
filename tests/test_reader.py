"""Reading prompts files: CSV quoting, Unicode, JSONL, defaults and per-row errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLES, write_csv

from common.errors import InputFileError
from common.naming import derived_seed
from producer.enqueue import check_file
from producer.reader import Row, RowDefaults, RowError, read_rows

DEFAULTS = RowDefaults(model="tiny", width=64, height=64, steps=3)


def rows(path: Path) -> list[Row | RowError]:
    return list(read_rows(path, DEFAULTS))


def test_example_csv_keeps_commas_quotes_and_unicode():
    parsed = rows(EXAMPLES / "prompts.csv")
    assert all(isinstance(r, Row) for r in parsed)
    prompts = [r.item.prompt for r in parsed]
    assert 'the word "diffq" written in neon on a brick wall' in prompts
    assert "富士山と桜、浮世絵風" in prompts
    assert "a bowl of ramen, steam rising, 35mm photo" in prompts
    ramen = next(r for r in parsed if r.item.id == "ramen")
    assert (ramen.item.seed, ramen.item.negative_prompt) == (42, "text, watermark")


def test_empty_cells_take_flag_defaults_and_derived_seeds(tmp_path):
    path = write_csv(tmp_path / "p.csv", "prompt,seed,steps\na cat,,\na dog,5,7\n")
    cat, dog = rows(path)
    assert (cat.params.steps, dog.params.steps) == (3, 7)
    assert dog.item.seed == 5
    assert cat.item.seed == derived_seed("a cat", "", None) == 1171083260  # derived from the row, stable


def test_jsonl_rows_use_the_same_keys(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a cat", "width": 128, "guidance": 7}\n\n{"prompt": "a dog"}\n')
    cat, dog = rows(path)
    assert (cat.params.width, cat.params.guidance, dog.params.width) == (128, 7.0, 64)


def test_bad_rows_are_reported_with_file_and_line(tmp_path):
    path = write_csv(tmp_path / "bad.csv", "prompt,width,steps\nok,64,3\nbad width,1004,3\n,64,3\nsteps,64,0\n")
    with pytest.raises(InputFileError) as err:
        check_file(path, DEFAULTS)
    message = str(err.value)
    assert f"{path}:3: width 1004 is not a multiple of 8" in message
    assert f"{path}:4: prompt is empty" in message
    assert f"{path}:5: steps 0 is outside" in message
    assert "3 bad row(s); nothing was enqueued" in message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("caption,seed\nx,1\n", ":1: no 'prompt' column"),
        ("prompt,colour\nx,red\n", r"unknown column\(s\) 'colour'"),
    ],
)
def test_file_level_problems_raise_at_once(tmp_path, text, message):
    with pytest.raises(InputFileError, match=message):
        check_file(write_csv(tmp_path / "f.csv", text), DEFAULTS)


def test_missing_file_and_unknown_extension(tmp_path):
    with pytest.raises(InputFileError, match="no such file"):
        check_file(tmp_path / "nope.csv", DEFAULTS)
    with pytest.raises(InputFileError, match="unknown file type"):
        check_file(write_csv(tmp_path / "p.txt", "prompt\nx\n"), DEFAULTS)


def test_a_model_cell_picks_the_rows_model_with_its_presets_defaults_and_a_bad_one_is_the_rows_error(tmp_path):
    """The ``model`` column: an empty cell is ``--model``'s; a cell's model gives the row that
    preset's own defaults where no flag was given (tiny's 128², 8 steps beside SDXL's 1024²), a flag
    given still wins, and a model that is none names its row, nothing else."""
    rows = write_csv(tmp_path / "m.csv", "prompt,model,steps\na fox,,\na bird,tiny,\na cat,tiny,5\na dog,tinyy,\n")
    sdxl = RowDefaults(model="sdxl-random", check_paths=False)
    got = list(read_rows(rows, sdxl))
    fox, bird, cat, dog = got
    assert (fox.params.model, fox.params.width, fox.params.steps) == ("sdxl-random", 1024, 30)
    assert (bird.params.model, bird.params.width, bird.params.height, bird.params.steps) == ("tiny", 128, 128, 8)
    assert (cat.params.model, cat.params.steps) == ("tiny", 5)  # the cell wins over the preset
    assert isinstance(dog, RowError) and dog.line == 5
    assert "model 'tinyy' is neither a preset (did you mean 'tiny'?)" in dog.message, dog.message
    flagged = RowDefaults(model="sdxl-random", width=256, check_paths=False, given=frozenset({"width"}))
    assert next(r for r in read_rows(rows, flagged) if r.line == 3).params.width == 256  # a flag given wins
