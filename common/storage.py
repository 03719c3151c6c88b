"""Where images and metadata live: a local folder or an object-store prefix, through fsspec.

An output is either an absolute folder (``/data/out``) or a URL (``s3://bucket/prefix``, any
fsspec protocol). S3 and S3-compatible servers go through ``s3fs``; the endpoint comes from
``DIFFQ_S3_ENDPOINT_URL`` (or botocore's own ``AWS_ENDPOINT_URL``) and the credentials from
the usual ``AWS_*`` variables, profile or instance role.

On an object store, one PUT is one object: a reader sees the whole object under its final
name or nothing, so no temp-file-and-rename is needed. Listing is the cheap way to learn what
exists (1,000 names per request), so presence checks list a prefix instead of asking object by
object.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from pathlib import Path
from typing import Any

from common.errors import ConfigError

#: seconds to wait for an object store to accept a connection before saying it is unreachable
CONNECT_TIMEOUT_S = 5
#: concurrent requests for a batch of existence checks or reads
PARALLEL = 16


def is_url(location: str) -> bool:
    """``s3://bucket/x`` and other fsspec URLs; ``file://`` counts as a local folder."""
    return "://" in location and not location.startswith("file://")


def local_path(location: str) -> Path:
    return Path(location.removeprefix("file://")).expanduser().absolute()


def problem(exc: BaseException, location: str, endpoint_url: str = "") -> str | None:
    """One line saying what is wrong with ``location`` for an error raised while using it, or
    None when the error is not about the storage (a bug, a bad argument)."""
    name = type(exc).__name__
    module = type(exc).__module__ or ""
    where = f"output {location!r}"
    if name == "NoCredentialsError":
        return f"{where}: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ReadTimeoutError") or (
        module.startswith("aiohttp") and "Connect" in name
    ):
        endpoint = endpoint_url or "the default AWS endpoint"
        return f"{where}: cannot reach {endpoint}: check DIFFQ_S3_ENDPOINT_URL and the network"
    if isinstance(exc, FileNotFoundError) and "bucket" in str(exc).lower():
        return f"{where}: the bucket does not exist: create it or fix the URL"
    if isinstance(exc, PermissionError):
        return f"{where}: access denied ({exc}): check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY and the bucket policy"
    if isinstance(exc, OSError) or module.startswith(("botocore", "aiobotocore", "aiohttp", "s3fs")):
        return f"{where}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"
    return None


class Store:
    """A local folder or an object-store prefix, addressed by paths relative to it.

    Built lazily per process (s3fs holds an event loop and connections that do not survive a
    fork)."""

    def __init__(self, location: str, endpoint_url: str = "") -> None:
        self.location = location
        self.endpoint_url = endpoint_url
        self.remote = is_url(location)
        self._pid = -1
        self._fs: Any = None

    def __repr__(self) -> str:
        return f"Store({self.location!r})"

    @property
    def fs(self) -> Any:
        if self._fs is None or self._pid != os.getpid():
            self._fs, self._pid = self._open(), os.getpid()
        return self._fs

    def _open(self) -> Any:
        if not self.remote:
            import fsspec

            return fsspec.filesystem("file")
        import fsspec

        protocol = self.location.split("://", 1)[0]
        options: dict[str, Any] = {}
        if protocol in ("s3", "s3a"):
            try:
                import s3fs  # noqa: F401 - the error below is the user's one line
            except ImportError:
                raise ConfigError(f"output {self.location!r} needs s3fs: pip install 'diffq[s3]'") from None
            client: dict[str, Any] = {}
            if self.endpoint_url:
                client["endpoint_url"] = self.endpoint_url
            options = {
                "client_kwargs": client,
                "config_kwargs": {
                    "connect_timeout": CONNECT_TIMEOUT_S,
                    "read_timeout": 60,
                    "retries": {"max_attempts": 3, "mode": "standard"},
                },
                "use_listings_cache": False,  # other workers write here too: never trust an old listing
                "skip_instance_cache": True,
            }
        try:
            fs, _ = fsspec.url_to_fs(self.location, **options)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"output {self.location!r}: {exc}") from None
        return fs

    @cached_property
    def root(self) -> str:
        if not self.remote:
            return str(local_path(self.location))
        return self.fs._strip_protocol(self.location).rstrip("/")

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def url(self, rel: str) -> str:
        """What a user would type to reach ``rel`` (for messages)."""
        return f"{self.location.rstrip('/')}/{rel}"

    # -- writing -----------------------------------------------------------------------
    def put(self, rel: str, data: bytes) -> None:
        """Write ``data`` whole under ``rel``: nobody ever sees a part of it under that name."""
        if self.remote:
            self.fs.pipe_file(self.path(rel), data)
            return
        target = Path(self.path(rel))
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def put_file(self, rel: str, local: Path) -> None:
        """Copy a finished local file under ``rel`` (one PUT, or a multipart upload that only
        shows up when it is complete)."""
        if self.remote:
            self.fs.put_file(str(local), self.path(rel))
            return
        target = Path(self.path(rel))
        target.parent.mkdir(parents=True, exist_ok=True)
        if _same_device(local, target.parent):
            os.replace(local, target)
        else:
            self.put(rel, local.read_bytes())

    def delete(self, rel: str) -> None:
        self.fs.rm_file(self.path(rel))
        if not self.remote:  # a folder left empty under the root is not part of anything
            folder = os.path.dirname(rel)
            while folder:
                try:
                    os.rmdir(self.path(folder))
                except OSError:
                    break
                folder = os.path.dirname(folder)

    def remove_tree(self, rel: str) -> None:
        """Everything under ``rel``, if anything."""
        if not self.remote:
            shutil.rmtree(self.path(rel), ignore_errors=True)
        elif self.fs.exists(self.path(rel)):
            self.fs.rm(self.path(rel), recursive=True)

    def probe(self) -> None:
        """Write and delete one small object: proves the bucket exists, the credentials may
        write and the endpoint answers."""
        rel = f".diffq-probe.{socket.gethostname().split('.')[0]}.{os.getpid()}"
        self.put(rel, b"diffq probe\n")
        self.delete(rel)

    # -- reading -----------------------------------------------------------------------
    def read(self, rel: str) -> bytes:
        return self.fs.cat_file(self.path(rel))

    def read_many(self, rels: list[str], missing_ok: bool = False) -> dict[str, bytes]:
        """Read several objects at once (concurrent requests on an object store); with
        ``missing_ok`` the ones that do not exist are left out of the answer."""
        if not rels:
            return {}
        found: dict[str, bytes] = {}
        if self.remote:
            got = self.fs.cat([self.path(r) for r in rels], on_error="return" if missing_ok else "raise")
            prefix = len(self.root) + 1
            for path, data in got.items():
                if isinstance(data, FileNotFoundError):
                    continue
                if isinstance(data, BaseException):
                    raise data
                found[path[prefix:]] = data
            return found
        for rel in rels:
            try:
                found[rel] = Path(self.path(rel)).read_bytes()
            except FileNotFoundError:
                if not missing_ok:
                    raise
        return found

    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))

    def existing(self, rels: Iterable[str]) -> set[str]:
        """Which of ``rels`` exist (a few concurrent requests for the handful a job has)."""
        rels = list(rels)
        if not self.remote:
            return {r for r in rels if os.path.exists(self.path(r))}
        with ThreadPoolExecutor(max_workers=min(PARALLEL, max(1, len(rels)))) as pool:
            found = list(pool.map(self.exists, rels))
        return {r for r, there in zip(rels, found, strict=True) if there}

    def listing(self, prefix: str) -> Iterator[str]:
        """Every object under ``prefix`` (relative names, in no particular order for local
        folders); an object store answers 1,000 names per request."""
        base = self.path(prefix).rstrip("/")
        if not self.remote:
            if not os.path.isdir(base):
                return
            for folder, _, files in os.walk(base):
                rel_folder = os.path.relpath(folder, self.root)
                for name in files:
                    yield name if rel_folder == "." else f"{rel_folder}/{name}"
            return
        if not self.fs.exists(base):
            return
        cut = len(self.root) + 1
        for path in self.fs.find(base):
            yield path[cut:]


def _same_device(a: Path, b: Path) -> bool:
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False
