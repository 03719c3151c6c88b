"""The file formats an image can be written in, each one object that every tool asks.

A campaign picks one with ``--image-format`` (``png``, ``jpeg``, ``jpeg:90``, ``webp``,
``webp:85``, ``webp:lossless``). The worker encodes with it, naming gives the file its
extension, ``producer verify`` asks it whether a file is whole and ``--repair`` reads an image's
parameters back through it, export names the files in a shard by it. PNG is the default, and a
PNG campaign's keys and names are the ones they always were: the format enters an item's key only
when it is not PNG (a JPEG is other pixels).

Where the parameters live: a PNG carries a ``prompt`` and a ``diffq`` iTXt chunk (any Unicode);
a JPEG or WebP carries the same JSON in EXIF's ImageDescription (tag 0x010E, ASCII, so it is
written with ``\\uXXXX`` escapes and reads back exactly), which exiftool and every viewer show.
JPEG's EXIF segment holds at most 64 KiB: :func:`check_fits` refuses, at enqueue, a prompt that
could not be carried.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from io import BytesIO
from typing import Any

from PIL import Image, ImageFile
from PIL.PngImagePlugin import PngInfo

from common.errors import InvalidJobSpec

DEFAULT = "png"
#: the default quality of each lossy format (Pillow's scale, 1-100)
QUALITY = {"jpeg": 95, "webp": 90}
EXIF_DESCRIPTION = 0x010E
EXIF_SOFTWARE = 0x0131
#: what a JPEG's EXIF segment can hold of the prompts' JSON text (the segment is 65,533 bytes;
#: the rest of the record is small and bounded)
JPEG_TEXT_LIMIT = 56_000
PNG_HEAD = b"\x89PNG\r\n\x1a\n"
PNG_TAIL = b"\x00\x00\x00\x00IEND\xaeB`\x82"
#: the bytes :meth:`ImageFormat.is_whole` needs from each end of a file
ENDS = 12
#: Pillow hands an encoder's output back to Python in pieces of ``ImageFile.MAXBLOCK`` (64 KiB),
#: retaking the GIL for each one: a 1024² PNG of noise-like pixels was 49 pieces, and a writer
#: thread can wait up to a switch interval (5 ms) for each behind a main thread that is launching
#: kernels. 16 MiB holds a 2048² RGB image in one piece, so the encoder runs without the GIL from
#: start to end (Pillow's own comment on MAXBLOCK: "make it a configuration parameter").
ENCODE_BLOCK = 1 << 24
ImageFile.MAXBLOCK = max(ImageFile.MAXBLOCK, ENCODE_BLOCK)


@dataclass(frozen=True)
class ImageFormat:
    """One format and its settings: how to encode, how a file is named, how to tell a whole file."""

    name: str  # png, jpeg or webp
    quality: int | None = None  # lossy formats; None: lossless

    @property
    def extension(self) -> str:
        return {"png": "png", "jpeg": "jpg", "webp": "webp"}[self.name]

    @property
    def media_type(self) -> str:
        """What an HTTP server sends the file as (the gallery)."""
        return f"image/{self.name}"

    @property
    def spec(self) -> str:
        """As ``--image-format`` takes it (and the metadata records it)."""
        if self.name == "png":
            return "png"
        if self.quality is None:
            return f"{self.name}:lossless"
        return self.name if self.quality == QUALITY[self.name] else f"{self.name}:{self.quality}"

    def encode(self, image: Image.Image, params: dict[str, Any]) -> bytes:
        """The file's bytes, with every parameter inside."""
        buffer = BytesIO()
        if self.name == "png":
            info = PngInfo()
            info.add_itxt("prompt", params.get("prompt", ""))
            info.add_itxt("diffq", json.dumps(params, ensure_ascii=False, sort_keys=True))
            image.save(buffer, format="PNG", pnginfo=info, compress_level=1)
            return buffer.getvalue()
        exif = Image.Exif()
        exif[EXIF_DESCRIPTION] = json.dumps(params, ensure_ascii=True, sort_keys=True)
        exif[EXIF_SOFTWARE] = "diffq"
        options: dict[str, Any] = {"exif": exif.tobytes()}
        if self.name == "webp":
            options |= {"lossless": True} if self.quality is None else {"quality": self.quality, "method": 4}
        else:
            options |= {"quality": self.quality}
        image.save(buffer, format=self.name.upper(), **options)
        return buffer.getvalue()

    def is_whole(self, head: bytes, tail: bytes, size: int) -> bool:
        """Whether a file whose first and last bytes these are was written to its end: a cut
        file (a crash in a non-atomic copy, a truncated transfer) fails."""
        if self.name == "png":
            return size > 20 and head[:8] == PNG_HEAD and tail[-12:] == PNG_TAIL
        if self.name == "jpeg":
            return size > 4 and head[:3] == b"\xff\xd8\xff" and tail[-2:] == b"\xff\xd9"
        riff = int.from_bytes(head[4:8], "little")  # WebP: a RIFF container that states its own size
        return size > 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP" and riff + 8 == size


@functools.lru_cache(maxsize=64)
def parse(text: str) -> ImageFormat:
    """``png``, ``jpeg``, ``jpeg:90``, ``webp``, ``webp:85`` or ``webp:lossless``; anything else
    is a job-spec error that says what is accepted."""
    name, _, setting = str(text).strip().lower().partition(":")
    name = {"jpg": "jpeg"}.get(name, name)
    if name not in ("png", "jpeg", "webp"):
        raise InvalidJobSpec(f"image_format {text!r} is not one of png, jpeg, webp (jpeg:90 sets the quality)")
    if name == "png":
        if setting:
            raise InvalidJobSpec(f"image_format {text!r}: PNG is lossless and takes no quality; write png")
        return ImageFormat("png")
    if setting == "lossless" and name == "webp":
        return ImageFormat("webp", None)
    if not setting:
        return ImageFormat(name, QUALITY[name])
    if not setting.isdigit() or not 1 <= int(setting) <= 100:
        raise InvalidJobSpec(f"image_format {text!r}: the quality after ':' is a whole number 1-100")
    return ImageFormat(name, int(setting))


def check(name: str, value: Any) -> None:
    """The job spec's check of the ``image_format`` parameter."""
    if not isinstance(value, str):
        raise InvalidJobSpec(f"{name} must be text such as png, jpeg:90 or webp")
    parse(value)


def check_fits(fmt: ImageFormat, prompt: str, negative_prompt: str) -> None:
    """A JPEG carries its parameters in one EXIF segment of at most 64 KiB: refuse, before
    anything is made, a row whose prompts would not fit, rather than write an image without them."""
    if fmt.name != "jpeg":
        return
    size = len(json.dumps(prompt, ensure_ascii=True)) + len(json.dumps(negative_prompt, ensure_ascii=True))
    if size > JPEG_TEXT_LIMIT:
        raise InvalidJobSpec(
            f"prompt and negative prompt take {size:,} bytes in a JPEG's EXIF, which holds {JPEG_TEXT_LIMIT:,}: "
            "use --image-format png or webp for these rows"
        )


#: every format by the extension its files have
BY_EXTENSION = {fmt.extension: fmt for fmt in (ImageFormat("png"), ImageFormat("jpeg", 95), ImageFormat("webp", 90))}


def of_file(name: str) -> ImageFormat | None:
    """The format a file's name says (its extension), for reading: quality does not matter there."""
    return BY_EXTENSION.get(name.rpartition(".")[2].lower())


def params_text(image: Image.Image) -> str | None:
    """The JSON text of the parameters an opened image carries, whatever its format (None: none)."""
    text = image.info.get("diffq") if image.format == "PNG" else image.getexif().get(EXIF_DESCRIPTION)
    return text if isinstance(text, str) else None
