"""The runtime's device layer (compiler/runtime/device.py): the host CPU device's memory and modules,
and an Executable running an artifact's plan through whatever device it is given."""
from __future__ import annotations

import numpy as np

import compiler
from compiler.runtime.artifact import read_manifest
from compiler.runtime.device import CpuDevice
from compiler.runtime.executable import Executable

from .test_executable import feeds, mlp_graph


def test_cpu_memory_is_aligned_and_copies_round_trip():
    dev = CpuDevice()
    mem = dev.allocate(1000)
    assert mem.address % 64 == 0 and mem.nbytes == 1000
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    dev.copy_in(mem, 128, x)
    np.testing.assert_array_equal(dev.copy_out(mem, 128, np.float32, (3, 4)), x)
    view = dev.view(mem, 128, np.float32, (12,))
    view[0] = 7
    assert dev.copy_out(mem, 128, np.float32, (1,))[0] == 7  # a view is the memory itself
    out = dev.copy_out(mem, 128, np.float32, (1,))
    out[0] = 9
    assert view[0] == 7  # a copy is not
    dev.free(mem)


class CountingDevice(CpuDevice):
    """The CPU, counting what the executable asks of it."""

    def __init__(self):
        self.calls = {"load_module": 0, "allocate": 0, "run": 0, "copy_out": 0}

    def load_module(self, data, label):
        self.calls["load_module"] += 1
        return super().load_module(data, label)

    def allocate(self, nbytes):
        self.calls["allocate"] += 1
        return super().allocate(nbytes)

    def run(self, fn, *args):
        self.calls["run"] += 1
        return super().run(fn, *args)

    def copy_out(self, mem, offset, dtype, shape):
        self.calls["copy_out"] += 1
        return super().copy_out(mem, offset, dtype, shape)


def test_an_executable_runs_through_its_device(tmp_path):
    path = str(tmp_path / "mlp.kiln")
    ref = compiler.compile(mlp_graph(), output=path)
    dev = CountingDevice()
    exe = Executable(path, read_manifest(path), device=dev)
    x = feeds()
    for _ in range(3):
        got = exe.run(x)
    want = ref.run(x)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert dev.calls["load_module"] == 1 and dev.calls["allocate"] == 1  # one arena, reused
    assert dev.calls["run"] == 3 and dev.calls["copy_out"] == 3 * len(want)
