"""The machine's devices, and the typed options of a multi-device compile.

A **CPU device** is a set of cores: the cores this process may use (``os.sched_getaffinity``) are
dealt out in order to the CPU devices a compile names, as evenly as they go (``cpu:0,cpu:1`` on a
2-core machine: one core each; on 16 cores: 8 each). Each device's speed is the machine's measured
sgemm peak and copy bandwidth at its thread count (``profiling.machine_roofline``: measured once,
cached), and its memory, unless ``DeviceOptions.memory`` says otherwise, an even share of the
machine's. ``cuda:N`` devices are listed (``kiln devices``) but not yet placed on: a CUDA model
compiles whole with ``--target cuda``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from . import limits
from .ir.ops.device import DEVICE_NAME
from .passes.options import OptionError
from .passes.split_devices import DeviceSpec

PARALLEL_MODES = ("auto", "pipeline", "data")


@dataclass(frozen=True)
class DeviceOptions:
    """Where a model runs: ``devices`` ("cpu:0", "cpu:1", ...), each device's memory in bytes
    (``memory``; default an even share of the machine's), ``parallel`` ("auto", "pipeline" or
    "data") and, for pipelines, ``microbatch`` (rows per item flowing through the stages; default the
    whole batch)."""

    devices: tuple[str, ...]
    memory: Mapping[str, int] = field(default_factory=dict)
    parallel: str = "auto"
    microbatch: int | None = None

    def __post_init__(self):
        devices = tuple(self.devices)
        object.__setattr__(self, "devices", devices)
        object.__setattr__(self, "memory", dict(self.memory))
        if len(devices) < 2:
            raise OptionError(f"a multi-device compile needs at least two devices, got {', '.join(devices) or 'none'} "
                              f"(one device: compile without devices)")
        for d in devices:
            if not DEVICE_NAME.match(d):
                raise OptionError(f"device {d!r}: expected a name like cpu:0 or cuda:1 (`kiln devices` lists them)")
        if len(set(devices)) != len(devices):
            raise OptionError(f"a device is named twice in {','.join(devices)}")
        cuda = [d for d in devices if d.startswith("cuda")]
        if cuda:
            raise OptionError(f"{', '.join(cuda)}: CUDA devices are not placed on yet (a model compiles whole for "
                              f"one GPU with --target cuda); give CPU devices")
        for d, n in self.memory.items():
            if d not in devices:
                raise OptionError(f"device memory given for {d}, which is not one of the devices {','.join(devices)}")
            if int(n) < 1:
                raise OptionError(f"device memory of {d} must be positive, got {n}")
        if self.parallel not in PARALLEL_MODES:
            raise OptionError(f"parallel must be one of {', '.join(PARALLEL_MODES)}, got {self.parallel!r}")
        if self.microbatch is not None and int(self.microbatch) < 1:
            raise OptionError(f"microbatch must be at least 1, got {self.microbatch}")
        if self.microbatch is not None and self.parallel == "data":
            raise OptionError("microbatch applies to pipeline parallelism (data parallelism splits the batch "
                              "across the devices)")

    @classmethod
    def make(cls, devices, memory: Mapping[str, int] | None = None, parallel: str = "auto",
             microbatch: int | None = None) -> "DeviceOptions":
        """From ``devices`` as a ``DeviceOptions`` (returned as is), a list of names, or "cpu:0,cpu:1"."""
        if isinstance(devices, DeviceOptions):
            return devices
        if isinstance(devices, str):
            devices = [d.strip() for d in devices.split(",") if d.strip()]
        return cls(tuple(devices), dict(memory or {}), parallel, microbatch)


def usable_cores() -> list[int]:
    """The CPU cores this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def cpu_cores(names: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The cores of each CPU device named: the usable cores dealt out in order, as evenly as they go."""
    cores = usable_cores()
    if len(names) > len(cores):
        raise OptionError(f"{len(names)} CPU devices named, but this process may use {len(cores)} core(s): "
                          f"at most {len(cores)} CPU devices")
    out, start = {}, 0
    for i, name in enumerate(names):
        n = len(cores) // len(names) + (1 if i < len(cores) % len(names) else 0)
        out[name] = tuple(cores[start:start + n])
        start += n
    return out


def device_specs(opts: DeviceOptions, roofline=None) -> list[DeviceSpec]:
    """The ``DeviceSpec`` of each device of ``opts``, in order: cores, memory, measured speed.
    ``roofline(nthreads) -> {"gflops", "gbs"}`` (default ``profiling.machine_roofline``)."""
    if roofline is None:
        from .profiling import machine_roofline as roofline
    cores = cpu_cores(opts.devices)
    share = limits.machine_memory() // len(opts.devices)
    specs = []
    for name in opts.devices:
        roof = roofline(len(cores[name]))
        specs.append(DeviceSpec(name, int(opts.memory.get(name, share)), float(roof["gflops"]), float(roof["gbs"]),
                                cores[name]))
    return specs


def list_devices() -> list[dict]:
    """What ``kiln devices`` shows: one CPU device per usable core (the finest split; a compile's
    ``--devices`` deals the cores out to the devices it names), and the CUDA devices numba sees."""
    cores = usable_cores()
    memory = limits.machine_memory()
    out = [{"name": f"cpu:{i}", "kind": "cpu", "cores": [c], "memory_bytes": memory // len(cores)}
           for i, c in enumerate(cores)]
    try:
        from numba import cuda

        if cuda.is_available():
            for i, d in enumerate(cuda.list_devices()):
                out.append({"name": f"cuda:{i}", "kind": "cuda", "model": d.name.decode() if isinstance(
                    d.name, bytes) else str(d.name), "placement": "whole models only (--target cuda)"})
    except Exception:  # no numba.cuda, no driver: no CUDA devices
        pass
    return out


__all__ = ["DeviceOptions", "PARALLEL_MODES", "cpu_cores", "device_specs", "list_devices", "usable_cores"]
