"""Calibration data for static int8 quantization, and the measurement the quantize pass asks for.

Data is a directory of samples (one ``.npz`` per sample holding an array per input name, or one
``.npy`` per sample for a model with one input), read in name order, or from Python any iterable of
feed dicts. ``calibrator(samples, method=...)`` is the ``Calibrate`` callback of
``passes/quantize.py``: it copies the graph as the pipeline has it (so the observed values are the
ones the pass rewrites), makes them outputs, compiles the copy as a float model and runs every
sample. The range it returns per value:

* ``minmax``: the smallest and largest element seen;
* ``percentile``: from a histogram (``BINS`` bins over the min/max range, a second run of the
  samples), the range holding all but ``100 - p`` percent of the elements (``p`` = 99.999 by
  default), cut equally from both ends (from the top only when nothing is negative);
* ``entropy``: the clipping threshold whose quantized distribution is closest to the histogram in
  Kullback-Leibler divergence (the method TensorRT made standard): over ``|x|`` with 128 levels a
  side, or over ``x`` with 255 levels when nothing is negative.
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


def feeds_for(sample: dict, inputs: Sequence[str], index: int) -> dict[str, np.ndarray]:
    """Sample ``index``'s arrays for a model taking ``inputs`` (a lone .npy array: its only input)."""
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


#: histogram bins of the percentile and entropy calibrators
BINS = 2048


def percentile_range(hist: np.ndarray, lo: float, hi: float, p: float) -> tuple[float, float]:
    """The range over ``[lo, hi]`` (``hist``: counts in equal bins) holding ``p`` percent of the
    elements: the rest cut from the top alone when ``lo >= 0``, else half from each end."""
    edges = np.linspace(lo, hi, len(hist) + 1)
    cum = np.cumsum(hist) / max(hist.sum(), 1)
    cut = (100.0 - p) / 100.0
    top = edges[min(int(np.searchsorted(cum, 1.0 - (cut if lo >= 0 else cut / 2))) + 1, len(hist))]
    bottom = lo if lo >= 0 else edges[int(np.searchsorted(cum, cut / 2, side="right"))]
    return float(min(bottom, 0.0) if lo < 0 else lo), float(max(top, 0.0))


def entropy_threshold(hist: np.ndarray, levels: int, stride: int = 8) -> int:
    """The number of leading bins of ``hist`` (counts of |x| or of a non-negative x from 0) to keep:
    the one whose ``levels``-level quantization (outliers clipped into the last kept bin) is closest
    to the histogram in KL divergence."""
    hist = hist.astype(np.float64)
    best, best_kl = len(hist), np.inf
    for i in list(range(levels, len(hist), stride)) + [len(hist)]:
        kept = hist[:i]
        p = kept.copy()
        p[-1] += hist[i:].sum()  # the reference: the clipped elements in the last bin
        nonzero = kept > 0
        # the candidate: the kept bins (without the clipped ones) merged into ``levels`` buckets, each
        # bucket's count spread over its nonzero bins
        idx = np.minimum((np.arange(i) * levels) // i, levels - 1)
        sums = np.bincount(idx, weights=kept, minlength=levels)
        counts = np.bincount(idx, weights=nonzero, minlength=levels)
        q = np.where(nonzero, sums[idx] / np.maximum(counts[idx], 1), 0.0)
        ps, qs = p.sum(), q.sum()
        if ps == 0 or qs == 0:
            continue
        pn, qn = p / ps, q / qs
        m = pn > 0
        kl = float(np.sum(pn[m] * np.log(pn[m] / np.maximum(qn[m], 1e-12))))
        if kl < best_kl:
            best, best_kl = i, kl
    return best


def calibrator(samples: list[dict[str, np.ndarray]], target=None, nthreads: int | None = None,
               method: str = "minmax", percentile: float = 99.999):
    """The ``Calibrate`` callback over ``samples`` (the range per observed value by ``method``)."""
    if method not in ("minmax", "percentile", "entropy"):
        raise CalibrationError(f"unknown calibrator {method!r} (minmax, percentile, entropy)")

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
            feeds = feeds_for(sample, inputs, i)
            try:
                outs = exe.run(feeds)
            except KilnError as e:
                raise CalibrationError(f"calibration sample {i}: {e}") from None
            for j in range(len(values)):
                o = outs[f"observed{j}"]
                if o.size:
                    lo[j] = min(lo[j], float(np.nanmin(o)))
                    hi[j] = max(hi[j], float(np.nanmax(o)))
        lo = np.where(np.isfinite(lo), lo, 0.0)
        hi = np.where(np.isfinite(hi), hi, 0.0)
        if method == "minmax":
            return {id(v): (float(lo[j]), float(hi[j])) for j, v in enumerate(values)}
        # a second run: histograms over the ranges (of |x| where x has negative values, for entropy)
        signed = lo < 0
        top = np.where(signed & (method == "entropy"), np.maximum(-lo, hi), hi)
        bottom = np.where(signed & (method == "entropy"), 0.0, lo)
        hists = np.zeros((len(values), BINS))
        for i, sample in enumerate(samples):
            outs = exe.run(feeds_for(sample, inputs, i))
            for j in range(len(values)):
                o = outs[f"observed{j}"].ravel()
                o = o[np.isfinite(o)]
                if method == "entropy" and signed[j]:
                    o = np.abs(o)
                if o.size and top[j] > bottom[j]:
                    hists[j] += np.histogram(o, BINS, (bottom[j], top[j]))[0]
        ranges = {}
        for j, v in enumerate(values):
            if top[j] <= bottom[j]:
                ranges[id(v)] = (float(lo[j]), float(hi[j]))
            elif method == "percentile":
                ranges[id(v)] = percentile_range(hists[j], float(lo[j]), float(hi[j]), percentile)
            else:
                keep = entropy_threshold(hists[j], 128 if signed[j] else 255)
                t = float(bottom[j] + (top[j] - bottom[j]) * keep / BINS)
                ranges[id(v)] = (max(float(lo[j]), -t), min(float(hi[j]), t)) if signed[j] else (float(lo[j]), t)
        return ranges

    return calibrate


__all__ = ["BINS", "CalibrationError", "calibrator", "entropy_threshold", "feeds_for", "percentile_range",
           "read_samples"]
