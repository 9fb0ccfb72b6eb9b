"""Calibration data for static int8 quantization, and the measurement the quantize pass asks for.

Data is a directory of samples (one ``.npz`` per sample holding an array per input name, or one
``.npy`` per sample for a model with one input), read in name order, or from Python any iterable of
feed dicts. ``calibrator(samples)`` is the ``Calibrate`` callback of ``passes/quantize.py``: it
copies the graph as the pipeline has it (so the observed values are the ones the pass rewrites),
makes them outputs, compiles the copy as a float model, runs every sample and returns each value's
smallest and largest element seen.
"""
from __future__ import annotations

import os
from typing import Iterable, Mapping, Sequence

import numpy as np

from .errors import DataError, KilnError


class CalibrationError(DataError):
    """Calibration data that cannot be read or does not fit the model."""


def read_samples(data: "str | os.PathLike | Iterable[Mapping[str, np.ndarray]]") -> list[dict[str, np.ndarray]]:
    """The samples of ``data`` (a directory or an iterable of feed dicts), as a list of dicts."""
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if not os.path.isdir(path):
            raise CalibrationError(f"calibration data {path!r} is not a directory (of .npz or .npy samples)")
        samples = []
        for name in sorted(os.listdir(path)):
            full = os.path.join(path, name)
            if name.endswith(".npz"):
                with np.load(full, allow_pickle=False) as z:
                    samples.append({k: z[k] for k in z.files})
            elif name.endswith(".npy"):
                samples.append({"": np.load(full, allow_pickle=False)})  # the model's only input
        if not samples:
            raise CalibrationError(f"calibration directory {path!r} holds no .npz or .npy sample")
        return samples
    samples = [dict(s) for s in data]
    if not samples:
        raise CalibrationError("the calibration data is empty")
    return samples


def _feeds(sample: dict, inputs: Sequence[str], index: int) -> dict[str, np.ndarray]:
    if set(sample) == {""}:
        if len(inputs) != 1:
            raise CalibrationError(f"calibration sample {index} is one .npy array, but the model takes "
                                   f"{len(inputs)} inputs ({', '.join(inputs)}): use .npz files named by input")
        return {inputs[0]: sample[""]}
    missing = [n for n in inputs if n not in sample]
    if missing:
        raise CalibrationError(f"calibration sample {index} lacks input(s) {', '.join(missing)} "
                               f"(it has {', '.join(sorted(sample)) or 'none'})")
    return {n: sample[n] for n in inputs}


def calibrator(samples: list[dict[str, np.ndarray]], target=None, nthreads: int | None = None):
    """The ``Calibrate`` callback over ``samples`` (min/max per observed value)."""

    def calibrate(graph, values):
        from .driver import compile as kiln_compile
        from .ir.clone import clone

        copy, where = clone(graph)
        copy.set_outputs([where(v) for v in values], [f"observed{i}" for i in range(len(values))])
        exe = kiln_compile(copy, 2, target=target, nthreads=nthreads)
        lo = np.full(len(values), np.inf)
        hi = np.full(len(values), -np.inf)
        inputs = exe.input_names
        for i, sample in enumerate(samples):
            feeds = _feeds(sample, inputs, i)
            try:
                outs = exe.run(feeds)
            except KilnError as e:
                raise CalibrationError(f"calibration sample {i}: {e}") from None
            for j in range(len(values)):
                o = outs[f"observed{j}"]
                if o.size:
                    lo[j] = min(lo[j], float(np.nanmin(o)))
                    hi[j] = max(hi[j], float(np.nanmax(o)))
        return {id(v): (lo[j] if np.isfinite(lo[j]) else 0.0, hi[j] if np.isfinite(hi[j]) else 0.0)
                for j, v in enumerate(values)}

    return calibrate


__all__ = ["CalibrationError", "calibrator", "read_samples"]
