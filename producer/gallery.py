"""``producer gallery OUT``: look at an output in a browser, as the dashboard shows its queue.

Pages, all behind the dashboard's basic auth, on 127.0.0.1 unless ``--bind`` says otherwise:

- ``/``: the prompts, each with its images as thumbnails and each image's parameters and scores
  (its title), 20 prompts a page (``?page=2``); ``?where=aesthetic > 5.5`` keeps the images
  whose score or column compares so (``producer export --where``), ``?model=...``,
  ``?sampler=...``, ``?adapter=...`` and ``?image_format=...`` keep the images made so,
  ``?by=clip`` orders each prompt's images best first;
- ``/pairs?by=aesthetic&margin=0.5``: the ranked pairs ``producer export --pairs`` would write,
  side by side, the preferred image first;
- ``/image/<file_name>``: an image the metadata lists (nothing else under the folder is served).

The metadata is read once at start (one line per image, deduplicated as export does) and kept
in memory: about 1 KB a line, so 10⁵ images take some 100 MB. A local folder only.
"""

from __future__ import annotations

import base64
import hmac
import html
import json
import signal
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from common import image_format
from common.errors import ConfigError
from common.naming import METADATA_FILE
from producer.pairs import Where, pairs, value_of

PROMPTS_A_PAGE = 20
PAIRS_A_PAGE = 50


class Gallery:
    """An output's images by prompt, read from its metadata."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()
        path = self.folder / METADATA_FILE
        if not path.is_file():
            raise ConfigError(f"{folder}: no {METADATA_FILE}; give a diffq output folder")
        self.records: dict[str, dict[str, Any]] = {}
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a torn last line (a writer killed mid-append)
                if isinstance(record, dict) and isinstance(record.get("file_name"), str):
                    self.records.setdefault(record["file_name"], record)
        self.prompts: dict[str, list[dict[str, Any]]] = {}
        for name in sorted(self.records):
            record = self.records[name]
            self.prompts.setdefault(str(record.get("prompt", "")), []).append(record)

    def image(self, name: str) -> bytes | None:
        """The bytes of an image the metadata lists, else None (no other file is served)."""
        if name not in self.records:
            return None
        path = (self.folder / name).resolve()
        if self.folder not in path.parents or not path.is_file():
            return None
        return path.read_bytes()

    def groups(
        self, where: Where | None, by: str | None, equal: dict[str, str] | None = None
    ) -> list[tuple[str, list[dict[str, Any]]]]:
        chosen = []
        equal = equal or {}
        for prompt in sorted(self.prompts):
            images = [
                r
                for r in self.prompts[prompt]
                if (where is None or where.holds(r)) and all(str(r.get(k) or "") == v for k, v in equal.items())
            ]
            if by:
                images.sort(key=lambda r: (-(value_of(r, by) or float("-inf")), r["file_name"]))
            if images:
                chosen.append((prompt, images))
        return chosen


def _title(record: dict[str, Any]) -> str:
    shown = {k: record.get(k) for k in ("seed", "model", "adapter", "adapters", "sampler", "steps", "guidance")}
    words = [f"{k} {v}" for k, v in shown.items() if v not in (None, "")]
    words += [f"{k} {v:g}" for k, v in sorted((record.get("scores") or {}).items())]
    return " · ".join(words)


def _figure(record: dict[str, Any], note: str = "") -> str:
    src = "/image/" + html.escape(record["file_name"], quote=True)
    title = html.escape(_title(record), quote=True)
    scores = " ".join(f"{k} {v:.3g}" for k, v in sorted((record.get("scores") or {}).items()))
    caption = html.escape(f"{note}{record.get('model')} · seed {record.get('seed')} {scores}".strip())
    image = f'<a href="{src}"><img src="{src}" title="{title}" loading="lazy"></a>'
    return f"<figure>{image}<figcaption>{caption}</figcaption></figure>"


STYLE = (
    "body{font-family:sans-serif;margin:1em}section{margin:1em 0;border-top:1px solid #ccc}"
    "figure{display:inline-block;margin:4px;text-align:center}img{width:160px;height:160px;object-fit:contain;"
    "background:#eee}figcaption{font-size:12px;max-width:160px}.pair{display:flex;gap:8px;align-items:flex-start}"
)


def _page(title: str, body: str) -> bytes:
    head = f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
    return f"{head}<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>".encode()


#: the text columns a page filters on by equality (``?model=tiny&sampler=euler``)
EQUAL_FILTERS = ("model", "sampler", "adapter", "image_format")


def index(gallery: Gallery, query: dict[str, str]) -> bytes:
    where = Where.parse(query["where"]) if query.get("where") else None
    by = query.get("by") or None
    equal = {k: query[k] for k in EQUAL_FILTERS if query.get(k)}
    groups = gallery.groups(where, by, equal)
    page = max(1, int(query.get("page", "1") or 1))
    shown = groups[(page - 1) * PROMPTS_A_PAGE : page * PROMPTS_A_PAGE]
    images = sum(len(images) for _, images in groups)
    said = [str(where)] if where else []
    said += [f"{k} = {v}" for k, v in equal.items()]
    condition = f" where {html.escape(' and '.join(said))}" if said else ""
    body = [f"<p>{len(groups)} prompt(s), {images} image(s){condition}"]
    body.append(f" · page {page} of {max(1, -(-len(groups) // PROMPTS_A_PAGE))}</p>")
    for prompt, records in shown:
        figures = "".join(_figure(r) for r in records)
        body.append(f"<section><h2>{html.escape(prompt)}</h2>{figures}</section>")
    if page * PROMPTS_A_PAGE < len(groups):
        rest = {k: v for k, v in query.items() if k != "page"}
        link = "&".join(f"{k}={html.escape(v, quote=True)}" for k, v in rest.items())
        body.append(f'<p><a href="/?{link}&page={page + 1}">next page</a></p>')
    return _page(f"diffq gallery: {gallery.folder.name}", "".join(body))


def pairs_page(gallery: Gallery, query: dict[str, str]) -> bytes:
    by = query.get("by")
    if not by:
        return _page("pairs", "<p>name the score: /pairs?by=aesthetic&amp;margin=0.5</p>")
    margin = float(query.get("margin", "0") or 0)
    made = [pair for _, images in gallery.groups(None, None) for pair in pairs(images, by, margin)]
    page = max(1, int(query.get("page", "1") or 1))
    body = [f"<p>{len(made)} pair(s) by {html.escape(by)}, margin {margin:g}</p>"]
    for first, second in made[(page - 1) * PAIRS_A_PAGE : page * PAIRS_A_PAGE]:
        better, worse = (first, second) if first["_label"] else (second, first)
        body.append(
            f"<section><h2>{html.escape(str(better.get('prompt', '')))}</h2><div class='pair'>"
            f"{_figure(better, 'preferred · ')}{_figure(worse)}</div></section>"
        )
    return _page(f"diffq pairs: {gallery.folder.name}", "".join(body))


def handler(gallery: Gallery, username: str, password: str) -> type[BaseHTTPRequestHandler]:
    expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # a request log per thumbnail is noise

        def do_GET(self) -> None:
            if not hmac.compare_digest(self.headers.get("Authorization", ""), expected):
                self.send_response(HTTPStatus.UNAUTHORIZED)
                self.send_header("WWW-Authenticate", 'Basic realm="diffq gallery"')
                self.end_headers()
                return
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                if url.path == "/":
                    self._send(index(gallery, query), "text/html; charset=utf-8")
                elif url.path == "/pairs":
                    self._send(pairs_page(gallery, query), "text/html; charset=utf-8")
                elif url.path.startswith("/image/"):
                    name = unquote(url.path.removeprefix("/image/"))
                    data = gallery.image(name)
                    if data is None:
                        self.send_error(HTTPStatus.NOT_FOUND, "no such image in this output's metadata")
                        return
                    fmt = image_format.of_file(name)
                    self._send(data, fmt.media_type if fmt else "application/octet-stream")
                else:
                    self.send_error(HTTPStatus.NOT_FOUND)
            except (ConfigError, ValueError) as exc:
                self._send(
                    _page("not understood", f"<p>{html.escape(str(exc))}</p>"), "text/html", HTTPStatus.BAD_REQUEST
                )

        def _send(self, data: bytes, kind: str, status: HTTPStatus = HTTPStatus.OK) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def serve(folder: Path, bind: str, port: int, username: str, password: str, say: Any) -> None:
    """Serve ``folder`` until SIGINT or SIGTERM (exit 0)."""
    gallery = Gallery(folder)
    server = ThreadingHTTPServer((bind, port), handler(gallery, username, password))
    server.daemon_threads = True

    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    images = len(gallery.records)
    say(f"gallery of {folder} ({len(gallery.prompts)} prompt(s), {images} image(s)) on http://{bind}:{port}/ "
        f"(user {username}); Ctrl-C stops it")  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
