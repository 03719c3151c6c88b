"""Compiled graphs kept as files, so a restarted worker skips Dynamo's trace.

``torch.compile`` is lazy: each new process traces the UNet's Python again before the compile
caches can hand it kernels (on an H100 a warm host still spent 22-25 s of its first job so,
docs/benchmarks.md). torch's precompile (``aot_compile``, ``save_compiled_function``,
``torch.compiler.load_compiled_function``) keeps the traced bytecode, its guards and the
compiled graph with its kernels in one file; loading that file replaces the trace.

Each compiled module (the UNet, the VAE decoder) gets a :class:`Precompiled` forward. The first
call of an input signature (shapes, dtypes, flags) loads that signature's file, or, where none
exists, compiles it ahead of time with the call's own arguments and writes the file for the next
process. A file is keyed by everything it was compiled against: the module's structure, the
input signature, the speed levers, torch, diffusers, Python and the GPU. With a shared compile
cache (``--compile-cache redis``) the files also go to that Redis, so a new host of the fleet
loads one another host compiled.

The weights are inputs of the compiled graph, not constants in it: an adapter merged into them
between jobs is what the next call computes with. Any failure here (a torch without precompile,
a file another version wrote, a guard that does not hold) falls back to the lazy
``torch.compile`` of before, and the log says why once.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from worker.pipelines.compile_cache import FleetRedis

log = logging.getLogger("diffq.worker")

#: Redis key prefix of the shared files (the compile cache's own entries are ``pt2:*``)
REMOTE_PREFIX = "diffq:compiled:"
#: files larger than this stay local (Redis takes 512 MB a value; a fleet's few are tens of MB)
REMOTE_MAX_BYTES = 256 * 2**20


class Store:
    """Where the files live: a folder on this host, and a Redis the fleet shares (or none)."""

    def __init__(self, folder: Path, remote_url: str | None = None) -> None:
        self.folder = folder
        self.remote = FleetRedis(remote_url, "compiled graphs")
        self.compiled = 0  # files this process compiled (and wrote)
        self.loaded = 0  # files this process loaded instead of compiling

    def read(self, key: str) -> bytes | None:
        path = self.folder / f"{key}.pt2"
        if path.exists():
            return path.read_bytes()
        data = self.remote.call("get", REMOTE_PREFIX + key)
        if data:
            self._keep(key, lambda path: Path(path).write_bytes(data))
        return data

    def write(self, key: str, save: Callable[[str], None]) -> None:
        """``save(path)`` writes the file; it appears under its name whole or not at all, and
        goes to the shared Redis too."""
        self._keep(key, save)
        if self.remote.url:
            data = (self.folder / f"{key}.pt2").read_bytes()
            if len(data) <= REMOTE_MAX_BYTES:
                self.remote.call("set", REMOTE_PREFIX + key, data)

    def _keep(self, key: str, save: Callable[[str], None]) -> None:
        """The file on this host, by a temporary name renamed into place."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{key}.", suffix=".tmp")
        os.close(fd)
        try:
            save(tmp)
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from the host's other workers
            os.replace(tmp, self.folder / f"{key}.pt2")
        finally:
            Path(tmp).unlink(missing_ok=True)

    def forget(self, key: str) -> None:
        """A file that could not be loaded: compiled again and written over, here and remotely."""
        (self.folder / f"{key}.pt2").unlink(missing_ok=True)
        self.remote.call("delete", REMOTE_PREFIX + key)


def install(module: torch.nn.Module, store: Store, identity: dict[str, Any]) -> None:
    """Give ``module`` a precompiled forward (see the module docstring); ``identity`` names
    what its graphs depend on beyond the module itself (model, dtype, levers)."""
    module.forward = Precompiled(module, store, identity)


class Precompiled:
    """A module's forward: one ahead-of-time compiled function per input signature."""

    def __init__(self, module: torch.nn.Module, store: Store, identity: dict[str, Any]) -> None:
        self.module = module
        self.store = store
        self.base = fingerprint(module) | identity
        self.functions: dict[str, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if eager_stance():  # a memory probe, or a worker whose compiler failed: no graph wanted
            return call_forward(self.module, *args, **kwargs)
        signature = describe((args, kwargs))
        function = self.functions.get(signature)
        if function is None:
            try:
                function = self._load_or_compile(signature, args, kwargs)
            except Exception as exc:  # torch's precompile is young: any failure is the lazy compile's turn
                return self._give_up(failure(exc), args, kwargs)
            self.functions[signature] = function
        if not function.guard_check(self.module, *args, **kwargs):
            return self._give_up("its guards do not hold for this call", args, kwargs)
        return function(self.module, *args, **kwargs)

    def _load_or_compile(self, signature: str, args: tuple, kwargs: dict) -> Any:
        key = file_key(self.base, signature)
        data = self.store.read(key)
        if data is not None:
            try:
                function = load(self.module, data)
                self.store.loaded += 1
                log.info("compiled graphs: %s loaded from %s.pt2 (no trace)", self._name(), key[:12])
                function.disable_guard_check()  # checked once per call in __call__
                return function
            except Exception as exc:
                log.warning("compiled graphs: %s.pt2 could not be loaded (%s); compiling again", key[:12], failure(exc))
                self.store.forget(key)
        function = compile_ahead(self.module, args, kwargs)
        self.store.compiled += 1
        function.disable_guard_check()
        try:
            self.store.write(key, lambda path: save(self.module, function, path))
        except Exception as exc:  # the graph runs; only the next process pays the trace again
            log.warning("compiled graphs: %s compiled, but could not be kept (%s)", self._name(), failure(exc))
        else:
            log.info("compiled graphs: %s compiled ahead of time, kept as %s.pt2", self._name(), key[:12])
        return function

    def _give_up(self, why: str, args: tuple, kwargs: dict) -> Any:
        """Back to ``torch.compile`` for this module, for the rest of the process."""
        log.warning("compiled graphs: %s runs under lazy torch.compile instead (%s)", self._name(), why)
        del self.module.forward
        self.module.compile(fullgraph=True, dynamic=False)
        return self.module(*args, **kwargs)

    def _name(self) -> str:
        return type(self.module).__name__


def failure(exc: BaseException) -> str:
    """One line: the error and where torch raised it (the place to look when a release changes)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}{where}"


def eager_stance() -> bool:
    """``torch.compiler.set_stance("force_eager")`` is in force (torch.compile obeys it by itself;
    a precompiled function would not)."""
    return torch._dynamo.eval_frame._stance.stance == "force_eager"


def call_forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """What is compiled: the class's forward (an instance's own ``forward`` is this wrapper)."""
    return type(module).forward(module, *args, **kwargs)


def keep_guard(entries: list[Any]) -> list[bool]:
    """The guards a file can carry: not those on globals or object identities (which a new
    process cannot check, and which the file's key stands for), nor on functions' default
    values (code of the diffusers version in the key)."""
    from torch._dynamo.guards import CheckFunctionManager

    unsupported = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [
        not (
            entry.is_global
            or "__defaults__" in entry.name
            or "__kwdefaults__" in entry.name
            or entry.guard_type in unsupported
            or any(kind in unsupported for kind in (entry.derived_guard_types or ()))
        )
        for entry in entries
    ]


def external_data(module: torch.nn.Module) -> dict[str, Any]:
    """Objects a file refers to by name instead of carrying: a decorated forward's inner function
    (diffusers wraps the UNet's in ``apply_lora_scale``), which pickle cannot find by its name."""
    forward = type(module).forward
    inner = getattr(forward, "__wrapped__", None)
    return {"forward.__wrapped__": inner} if inner is not None else {}


def compile_ahead(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """The guards' state pickles the module's ``__dict__`` (tensors as meta, callables whole):
    this wrapper, with its Redis client, is out of it while the module is traced."""
    torch._dynamo.config.enable_aot_compile = True
    compiled = torch.compile(call_forward, fullgraph=True, dynamic=False, options={"guard_filter_fn": keep_guard})
    wrapper = module.__dict__.pop("forward", None)
    try:
        return compiled.aot_compile(((module, *args), kwargs))
    finally:
        if wrapper is not None:
            module.forward = wrapper


def save(module: torch.nn.Module, function: Any, path: str) -> None:
    function.save_compiled_function(path, external_data=external_data(module))


def load(module: torch.nn.Module, data: bytes) -> Any:
    torch._dynamo.config.enable_aot_compile = True
    return torch.compiler.load_compiled_function(io.BytesIO(data), external_data=external_data(module))


def describe(value: Any) -> str:
    """An input signature: what the graph was specialised on (shapes, dtypes, devices, strides
    and plain values), not the tensors' contents."""
    if isinstance(value, torch.Tensor):
        return f"T{tuple(value.shape)}{value.dtype}{value.device}{value.stride()}{value.requires_grad}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{describe(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list | tuple):
        return "(" + ",".join(describe(v) for v in value) + ")"
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    return type(value).__qualname__


#: packages whose code the key names by version; any other code in the graph is hashed by file
VERSIONED = frozenset({"torch", "diffusers", "transformers", "peft", "accelerate", "builtins", "functools"})


def fingerprint(module: torch.nn.Module) -> dict[str, Any]:
    """The module's structure: every submodule's class and attention processor, the functions
    set on an instance over its class's (FP8's GEGLU computes its GELU in the tanh form), every
    parameter's and buffer's name, shape and dtype (FP8 layers differ by their buffers: one that
    writes FP8 has an output scale); the source files of the code in it that is not a versioned
    package's (diffq's own FP8 layers and attention processors: an upgrade that changes their code must not load
    the graph the old one traced); and the software and GPU the graph is compiled for."""
    digest = hashlib.sha256()
    code: set[str] = set()
    for name, sub in module.named_modules():
        processor = getattr(sub, "processor", None)
        digest.update(f"{name}:{type(sub).__qualname__}:{type(processor).__qualname__}\n".encode())
        code.add(type(sub).__module__)
        if processor is not None:  # diffq's own processors are code in the graph too
            code.add(type(processor).__module__)
        for attribute, value in sorted(vars(sub).items()):
            if callable(value) and not isinstance(value, torch.nn.Module) and not attribute.startswith("_"):
                what = getattr(value, "__qualname__", type(value).__qualname__)
                digest.update(f"{name}.{attribute} = {what}\n".encode())
                code.add(getattr(value, "__module__", None) or type(value).__module__)
    for source in sorted(code):
        path = getattr(sys.modules.get(source), "__file__", None)
        if source.partition(".")[0] not in VERSIONED and path:
            digest.update(f"code {source}:".encode() + hashlib.sha256(Path(path).read_bytes()).digest())
    for name, param in module.named_parameters():
        digest.update(f"{name}:{tuple(param.shape)}:{param.dtype}\n".encode())
    for name, buffer in module.named_buffers():
        digest.update(f"buffer {name}:{tuple(buffer.shape)}:{buffer.dtype}\n".encode())
    import diffusers

    device = next(module.parameters()).device
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    return {
        "module": type(module).__qualname__,
        "structure": digest.hexdigest(),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "python": list(sys.version_info[:2]),
        "gpu": gpu,
    }


def file_key(base: dict[str, Any], signature: str) -> str:
    text = json.dumps(base | {"signature": signature}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
