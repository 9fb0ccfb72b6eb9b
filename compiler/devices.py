"""The machine's devices, and the typed options of a multi-device compile.

A **CPU device** is a set of cores: the cores this process may use (``os.sched_getaffinity``) are
dealt out in order to the CPU devices a compile names, as evenly as they go (``cpu:0,cpu:1`` on a
2-core machine: one core each; on 16 cores: 8 each). Each device's speed is the machine's measured
sgemm peak and copy bandwidth at its thread count (``profiling.machine_roofline``: measured once,
cached), and its memory, unless ``DeviceOptions.memory`` says otherwise, an even share of the
machine's. A ``cuda:N`` device is a GPU numba.cuda sees (or its simulator): its memory is the GPU's,
its speed nominal (``CUDA_GFLOPS``, ``CUDA_GBPS``; copies to it cross a ``CUDA_LINK_GBPS`` link).
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


#: a GPU's figures for placement where none are measured: f32 GFLOP/s and GB/s of a data-centre GPU of
#: Kiln's GEMM (a fraction of the peak), and the host link (PCIe) its copies cross
CUDA_GFLOPS, CUDA_GBPS, CUDA_LINK_GBPS = 5000.0, 1000.0, 12.0


def device_specs(opts: DeviceOptions, roofline=None) -> list[DeviceSpec]:
    """The ``DeviceSpec`` of each device of ``opts``, in order: cores, memory, speed (measured for
    CPU devices; ``CUDA_*`` for GPUs). ``roofline(nthreads) -> {"gflops", "gbs"}`` (default
    ``profiling.machine_roofline``)."""
    if roofline is None:
        from .profiling import machine_roofline as roofline
    cpus = [d for d in opts.devices if d.startswith("cpu")]
    cores = cpu_cores(cpus) if cpus else {}
    share = limits.machine_memory() // max(1, len(cpus))
    specs = []
    for name in opts.devices:
        if name.startswith("cuda"):
            memory = int(opts.memory.get(name, cuda_memory(name)))
            specs.append(DeviceSpec(name, memory, CUDA_GFLOPS, CUDA_GBPS, (), CUDA_LINK_GBPS))
            continue
        roof = roofline(len(cores[name]))
        specs.append(DeviceSpec(name, int(opts.memory.get(name, share)), float(roof["gflops"]), float(roof["gbs"]),
                                cores[name]))
    return specs


def cuda_memory(name: str) -> int:
    """The memory of GPU ``name`` ("cuda:0"); an ``OptionError`` when numba sees no such GPU."""
    from .codegen.cuda import numba_cuda

    cuda = numba_cuda()
    index = int(name.split(":")[1])
    if not cuda.is_available():
        raise OptionError(f"{name}: this machine has no usable CUDA GPU (numba.cuda.is_available() is False; "
                          f"NUMBA_ENABLE_CUDASIM=1 runs numba's simulator)")
    gpus = list(cuda.list_devices())
    if index >= len(gpus):
        raise OptionError(f"{name}: numba.cuda sees {len(gpus)} GPU(s)")
    try:
        with cuda.gpus[index]:
            return int(cuda.current_context().get_memory_info().total)
    except Exception:  # the simulator has no memory figures
        return 16 << 30


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
                    d.name, bytes) else str(d.name), "placement": "a pipeline stage or a replica (nominal speed)"})
    except Exception:  # no numba.cuda, no driver: no CUDA devices
        pass
    return out


__all__ = ["DeviceOptions", "PARALLEL_MODES", "cpu_cores", "device_specs", "list_devices", "usable_cores"]
