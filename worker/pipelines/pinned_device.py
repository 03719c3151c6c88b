"""A pipeline's execution device, looked up once instead of twice a batch.

diffusers 0.42 answers ``DiffusionPipeline._execution_device`` by walking every submodule of
every component: once for group offloading's hooks, then for accelerate's. SDXL has 2,717
modules. The worker asks once before a batch's encode, and the pipeline's own call asks again
before its first step, while the GPU waits for work. On one H200 a one-image SDXL job spent
10 ms of its 1.05 s outside its encode, denoise and decode, nearly all of it in the first walk
(``bench/results/h200-queue1-call.jsonl``). On this project's CPU machine, with the SDXL
architecture's UNet and text encoders stubbed out, a batch's host time went from 37.8 to
11.6 ms with the device pinned.

The device changes only when the pipeline moves or its offloading changes. So the pinned
class keeps the answer until one of those methods runs or a component is replaced, and then
asks diffusers again. Under model offload, diffusers re-applies its hooks after every call, so
such a pipeline still asks once a call, as before; it is slow for other reasons.
"""

from __future__ import annotations

from typing import Any

import torch

#: the pipeline methods after which the execution device may differ
MOVES = (
    "to",
    "enable_model_cpu_offload",
    "enable_sequential_cpu_offload",
    "enable_group_offload",
    "remove_all_hooks",
    "reset_device_map",
)
_KEY = "_diffq_execution_device"
_pinned_classes: dict[type, type] = {}


def _forget(pipe: Any) -> None:
    pipe.__dict__.pop(_KEY, None)


def _moving(name: str) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        _forget(self)
        try:
            return getattr(super(type(self), self), name)(*args, **kwargs)
        finally:
            _forget(self)  # a hook set up during the call may have asked with the old placement

    method.__name__ = name
    return method


def _pinned_class(cls: type) -> type:
    """``cls`` with ``_execution_device`` cached; the same name, so type checks and
    ``is_flux`` see the pipeline they loaded."""
    if cls not in _pinned_classes:

        def execution_device(self: Any) -> torch.device:
            device = self.__dict__.get(_KEY)
            if device is None:
                device = self.__dict__[_KEY] = super(pinned, self)._execution_device
            return device

        def setattr_(self: Any, name: str, value: Any) -> None:
            if isinstance(value, torch.nn.Module):
                _forget(self)
            super(pinned, self).__setattr__(name, value)

        body: dict[str, Any] = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "_execution_device": property(execution_device),
            "__setattr__": setattr_,
            **{name: _moving(name) for name in MOVES if hasattr(cls, name)},
        }
        pinned = type(cls.__name__, (_Pinned, cls), body)
        _pinned_classes[cls] = pinned
    return _pinned_classes[cls]


class _Pinned:
    """Marks a pinned class (its second base is the class it pins)."""


def pin(pipe: Any) -> Any:
    """Make ``pipe`` remember its execution device (in place; returned for chaining)."""
    if isinstance(pipe, _Pinned) or not hasattr(type(pipe), "_execution_device"):
        return pipe
    pipe.__class__ = _pinned_class(type(pipe))
    _ = pipe._execution_device  # asked now, while loading, not before the first batch
    return pipe


def unpin(pipe: Any) -> Any:
    """The pipeline as diffusers made it: its device looked up on every ask (benchmarks compare)."""
    if isinstance(pipe, _Pinned):
        _forget(pipe)
        pipe.__class__ = type(pipe).__bases__[1]
    return pipe
