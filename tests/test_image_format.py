"""``--image-format png|jpeg|webp``: one :class:`common.image_format.ImageFormat` answers every
tool. Its parameters round-trip through each format, a cut file is told from a whole one, a PNG
campaign keeps the keys it always had, and a campaign of JPEG and WebP rows goes through a real
worker, ``producer verify --repair`` and ``producer export`` with its files' own extensions."""

from __future__ import annotations

import json
import tarfile
from io import BytesIO

import numpy as np
import pytest
from conftest import TINY_FLAGS, assert_exactly_once, images_under, producer, run_worker, write_csv
from PIL import Image

from common import image_format
from common.errors import InvalidJobSpec
from common.jobspec import GenParams, JobSpec, PromptItem
from common.naming import item_key
from worker.output.images import image_bytes

PARAMS = {"prompt": 'un café ☕ au lait 😀 "quoted"', "negative_prompt": "blur", "seed": 7, "steps": 3}


def noise(side: int = 64) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8))


@pytest.mark.parametrize("spec", ["png", "jpeg", "jpeg:80", "webp", "webp:60", "webp:lossless"])
def test_each_format_carries_every_parameter_and_is_told_whole_from_cut(spec):
    fmt = image_format.parse(spec)
    params = {**PARAMS, "image_format": fmt.spec}
    data = image_bytes(noise(), params)
    with Image.open(BytesIO(data)) as image:
        assert image.format == {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}[fmt.name]
        assert json.loads(image_format.params_text(image)) == params  # Unicode survives, exactly
        pixels = np.asarray(image.convert("RGB"))
    lossless = fmt.name == "png" or fmt.quality is None
    assert np.array_equal(pixels, np.asarray(noise())) == lossless
    ends = image_format.ENDS
    assert fmt.is_whole(data[:ends], data[-ends:], len(data))
    for cut in (len(data) // 2, len(data) - 1):
        assert not fmt.is_whole(data[:ends], data[:cut][-ends:], cut), cut
    assert image_format.of_file(f"x.{fmt.extension}").name == fmt.name


def test_spellings_are_one_format_and_a_bad_one_is_refused_in_words():
    assert image_format.parse("JPG").spec == "jpeg" == image_format.parse("jpeg:95").spec
    assert image_format.parse("webp:lossless").quality is None
    for bad, said in (("gif", "is not one of png, jpeg, webp"), ("png:90", "takes no quality"),
                      ("jpeg:0", "1-100"), ("jpeg:high", "1-100")):  # fmt: skip
        with pytest.raises(InvalidJobSpec, match=said):
            GenParams(model="tiny", image_format=bad).validate()


def test_the_format_is_in_the_key_only_when_it_is_not_png():
    item = PromptItem(prompt="a fox", seed=1)
    png = item_key(GenParams(model="tiny"), item)
    assert item_key(GenParams(model="tiny", image_format="png"), item) == png  # a PNG campaign keeps its keys
    jpeg = item_key(GenParams(model="tiny", image_format="jpeg"), item)
    assert jpeg != png
    assert item_key(GenParams(model="tiny", image_format="JPG"), item) == jpeg  # one spelling per format
    assert item_key(GenParams(model="tiny", image_format="jpeg:80"), item) not in (png, jpeg)


def test_a_prompt_a_jpeg_cannot_carry_is_refused_before_anything_is_made():
    long = PromptItem(prompt="😀" * 4000, negative_prompt="😀" * 4000, seed=1)
    for spec in ("png", "webp"):
        JobSpec(params=GenParams(model="tiny", image_format=spec), output="/o", items=(long,)).validate()
    with pytest.raises(InvalidJobSpec, match="use --image-format png or webp"):
        JobSpec(params=GenParams(model="tiny", image_format="jpeg"), output="/o", items=(long,)).validate()


@pytest.mark.worker
def test_a_jpeg_and_webp_campaign_is_made_verified_repaired_and_exported_by_its_extensions(env, conn, tmp_path):
    out = tmp_path / "out"
    rows = write_csv(
        tmp_path / "p.csv",
        "prompt,image_format,num_images\n"
        + "".join(f"a jpeg {i},,2\n" for i in range(3))  # the flag's format
        + "".join(f"a webp {i},webp:lossless,1\n" for i in range(2)),  # the cell's
    )
    flags = (*TINY_FLAGS, "--image-format", "jpeg:90", "--output", out)
    assert producer("enqueue", rows, *flags).exit_code == 0
    assert run_worker(env).returncode == 0
    assert_exactly_once(out, 8)
    names = sorted(p.suffix for p in images_under(out))
    assert names == [".jpg"] * 6 + [".webp"] * 2
    lines = {
        json.loads(line)["file_name"]: json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()
    }
    assert {r["image_format"] for r in lines.values()} == {"jpeg:90", "webp:lossless"}
    for path in images_under(out):  # each file carries its own line's parameters
        with Image.open(path) as image:
            carried = json.loads(image_format.params_text(image))
        assert (
            carried["file_name"] == str(path.relative_to(out))
            and carried["seed"] == lines[carried["file_name"]]["seed"]
        )
    clean = producer("verify", out)
    assert clean.exit_code == 0 and "5 done item(s), 8 image(s), 8 metadata line(s)" in clean.output, clean.output
    again = producer("enqueue", rows, *flags)
    assert again.exit_code == 0 and "0 new" in again.output, again.output

    jpg, webp = next(p for p in images_under(out) if p.suffix == ".jpg"), images_under(out)[-1]
    jpg.write_bytes(jpg.read_bytes()[:-200])  # cut short: no end marker
    webp.write_bytes(webp.read_bytes()[:-10])  # shorter than its RIFF header says
    gone = next(p for p in images_under(out) if p.suffix == ".jpg" and p.name[:24] != jpg.name[:24])  # another item
    kept = [text for text in (out / "metadata.jsonl").read_text().splitlines()
            if json.loads(text)["file_name"] != str(gone.relative_to(out))]  # fmt: skip
    (out / "metadata.jsonl").write_text("\n".join(kept) + "\n")
    found = producer("verify", out)
    assert found.exit_code == 1, found.output
    assert "2 image(s) of done items missing (or not whole)" in found.output, found.output
    assert "1 image(s) of done items with no metadata line" in found.output, found.output
    fixed = producer("verify", out, "--repair")
    assert fixed.exit_code == 0 and "1 metadata line(s) rebuilt from their images" in fixed.output, fixed.output
    assert run_worker(env).returncode == 0
    assert_exactly_once(out, 8)
    final = producer("verify", out)
    assert final.exit_code == 0 and "clean" in final.output, final.output
    rebuilt = next(json.loads(t) for t in (out / "metadata.jsonl").read_text().splitlines()
                   if json.loads(t)["file_name"] == str(gone.relative_to(out)))  # fmt: skip
    assert rebuilt == {k: v for k, v in lines[rebuilt["file_name"]].items() if k != "timings"}  # from the EXIF

    tar_to, folder_to = tmp_path / "wds", tmp_path / "imagefolder"
    for dest, shape in ((tar_to, "webdataset"), (folder_to, "imagefolder")):
        done = producer("export", out, "--to", dest, "--format", shape)
        assert done.exit_code == 0, done.output
    members = []
    for shard in sorted(tar_to.glob("*.tar")):
        with tarfile.open(shard) as tar:
            members += tar.getnames()
    assert sorted(m.rpartition(".")[2] for m in members if not m.endswith(".json")) == ["jpg"] * 6 + ["webp"] * 2
    exported = [json.loads(t) for f in sorted(folder_to.glob("*/metadata.jsonl")) for t in f.read_text().splitlines()]
    assert sorted(r["file_name"].rpartition(".")[2] for r in exported) == ["jpg"] * 6 + ["webp"] * 2
    for record, shard in ((r, f.parent) for f in sorted(folder_to.glob("*/metadata.jsonl")) for r in
                          [json.loads(t) for t in f.read_text().splitlines()]):  # fmt: skip
        with Image.open(shard / record["file_name"]) as image:
            image.load()


@pytest.mark.parametrize("spec", ["png", "jpeg"])
def test_a_full_size_image_is_encoded_in_one_piece_so_a_writer_thread_takes_the_gil_back_once(spec, monkeypatch):
    """Pillow hands an encoder's output back to Python in ``ImageFile.MAXBLOCK`` pieces (64 KiB by
    default), retaking the GIL for each: a 1024² noise PNG was 49 pieces, each of which can wait a
    switch interval behind a worker's main thread launching kernels. One piece per image."""
    from PIL import Image as PILImage

    calls: list[int] = []
    make = PILImage._getencoder

    class Counted:
        def __init__(self, encoder):
            self._encoder = encoder

        def encode(self, bufsize):
            calls.append(bufsize)
            return self._encoder.encode(bufsize)

        def __getattr__(self, name):
            return getattr(self._encoder, name)

    monkeypatch.setattr(PILImage, "_getencoder", lambda *a, **kw: Counted(make(*a, **kw)))
    data = image_format.parse(spec).encode(noise(1024), PARAMS)
    assert len(data) > 4 * 65536  # big enough that the default would have cut it into pieces
    assert len(calls) == 1, f"{len(calls)} pieces of {calls[0]:,} bytes"
