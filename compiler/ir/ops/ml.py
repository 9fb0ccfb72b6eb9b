"""Classical ML ops: the ``ai.onnx.ml`` domain's LabelEncoder, TreeEnsemble, ArrayFeatureExtractor and
Binarizer, and the default domain's TfIdfVectorizer (n-gram counting)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..types import DType, TensorType, num_elements
from .base import Cost, OpDef, Pattern, check_dtype, known_ints

ML: str = "ai.onnx.ml"


def _one_of(op: OpDef, prefix: str, names: tuple[str, ...]) -> str:
    """The one attribute of ``names`` that is set (not None)."""
    given = [n for n in names if getattr(op, n) is not None]
    if len(given) != 1:
        which = f"{', '.join(given)} are all set" if given else "none is set"
        raise op.fail(f"exactly one of {', '.join(names)} must be set ({prefix} of the mapping); {which}")
    return given[0]


# ---------------------------------------------------------------------------------------------
# LabelEncoder
# ---------------------------------------------------------------------------------------------

_LABEL_TYPES = frozenset({DType.string, DType.i64, DType.f32, DType.i32, DType.i16, DType.f64})


@dataclass(frozen=True, eq=False)
class LabelEncoder(OpDef):
    """Maps each element through the table keys[i] -> values[i] (the last of repeated keys wins; a NaN key
    matches NaN); elements not among the keys become the default. Keys come from one of ``keys_floats``
    (f32), ``keys_int64s`` (i64), ``keys_strings`` or ``keys_tensor`` (1-D, its own element type) and must
    have X's element type; values likewise, giving Y's element type. The default is ``default_tensor``
    (one element) when given, else ``default_float``/``default_int64``/``default_string`` for list
    values, and for tensor values "_Unused", -1 or -0.0 by kind."""

    default_float: float = -0.0
    default_int64: int = -1
    default_string: str = "_Unused"
    default_tensor: np.ndarray | None = None
    keys_floats: tuple[float, ...] | None = None
    keys_int64s: tuple[int, ...] | None = None
    keys_strings: tuple[str, ...] | None = None
    keys_tensor: np.ndarray | None = None
    values_floats: tuple[float, ...] | None = None
    values_int64s: tuple[int, ...] | None = None
    values_strings: tuple[str, ...] | None = None
    values_tensor: np.ndarray | None = None

    domain: ClassVar = ML
    since: ClassVar = 4
    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.ELEMWISE

    _LIST_TYPES: ClassVar = {"floats": DType.f32, "int64s": DType.i64, "strings": DType.string}

    def _table(self, kind: str) -> np.ndarray:
        name = _one_of(self, kind, tuple(f"{kind}_{s}" for s in ("floats", "int64s", "strings", "tensor")))
        value = getattr(self, name)
        if name.endswith("_tensor"):
            if value.ndim != 1:
                raise self.fail(f"{name} must be a 1-D tensor, got shape {list(value.shape)}")
            arr = value
        else:
            dt = self._LIST_TYPES[name.rsplit("_", 1)[1]]
            arr = np.array(value, dtype=dt.np)
        dt = DType.from_numpy(arr.dtype)
        if dt not in _LABEL_TYPES:
            raise self.fail(f"{name} has element type {dt}; supported: "
                            f"{', '.join(sorted(d.short for d in _LABEL_TYPES))}")
        return arr

    def keys(self) -> np.ndarray:
        return self._table("keys")

    def values(self) -> np.ndarray:
        return self._table("values")

    def default(self) -> np.ndarray:
        vals = self.values()
        dt = vals.dtype
        if self.default_tensor is not None:
            d = self.default_tensor
            if d.size != 1:
                raise self.fail(f"default_tensor must hold one element, got shape {list(d.shape)}")
            if d.dtype != dt and not (d.dtype == object and dt == object):
                raise self.fail(f"default_tensor has element type {DType.from_numpy(d.dtype)}, the values have "
                                f"{DType.from_numpy(dt)}")
            return d.reshape(())
        if dt == object:
            return np.array(self.default_string, dtype=object)
        if dt.kind == "f":
            return np.array(self.default_float, dtype=dt)
        return np.array(self.default_int64, dtype=dt)

    def validate(self):
        keys, vals = self.keys(), self.values()
        if len(keys) != len(vals):
            raise self.fail(f"keys and values must have the same length, got {len(keys)} keys and "
                            f"{len(vals)} values")
        self.default()

    def infer(self, ins):
        (x,) = ins
        kt = DType.from_numpy(self.keys().dtype)
        if x.dtype is not kt:
            raise self.fail(f"X has element type {x.dtype}, but the keys are {kt} (they must match)")
        return [x.type.with_dtype(DType.from_numpy(self.values().dtype))]

    def compute(self, x):
        keys, vals, default = self.keys(), self.values(), self.default()
        if x.dtype == object:
            table = dict(zip(keys.tolist(), vals.tolist()))
            d = default.item()
            flat = [table.get(k, d) for k in x.ravel().tolist()]
            out = np.empty(x.size, dtype=vals.dtype)
            out[:] = flat
            return [out.reshape(x.shape)]
        # the last of repeated keys wins: unique over the reversed table keeps each key's last entry
        uk, first = np.unique(keys[::-1], return_index=True)
        uv = vals[::-1][first]
        out = np.full(x.shape, default, dtype=vals.dtype)
        if uk.size:
            pos = np.clip(np.searchsorted(uk, x), 0, uk.size - 1)
            hit = uk[pos] == x
            out[hit] = uv[pos[hit]]
            if keys.dtype.kind == "f":
                nan_keys = np.isnan(keys)
                if nan_keys.any():
                    out[np.isnan(x)] = vals[np.nonzero(nan_keys)[0][-1]]
        return [out]


# ---------------------------------------------------------------------------------------------
# TreeEnsemble
# ---------------------------------------------------------------------------------------------

_BRANCH_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "BRANCH_MEMBER")
_AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")
_POST = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")
_TREE_TYPES = frozenset({DType.f32, DType.f64, DType.f16})


def _erfinv(y: np.ndarray) -> np.ndarray:
    """Inverse error function (M. Giles' approximation, accurate to single precision)."""
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = -np.log((1.0 - y) * (1.0 + y))
        a = w - 2.5
        p = np.full(y.shape, 2.81022636e-08)
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                  -0.00417768164, 0.246640727, 1.50140941):
            p = c + p * a
        b = np.sqrt(w) - 3.0
        q = np.full(y.shape, -0.000200214257)
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                  0.00943887047, 1.00167406, 2.83297682):
            q = c + q * b
        return np.where(w < 5.0, p, q) * y


@dataclass(frozen=True, eq=False)
class TreeEnsemble(OpDef):
    """An ensemble of decision trees (the opset-5 encoding): X [N, F] -> Y [N, n_targets].

    Interior nodes (``nodes_*``, parallel lists) compare feature ``nodes_featureids[i]`` with
    ``nodes_splits[i]`` by ``nodes_modes[i]`` (0 <=, 1 <, 2 >=, 3 >, 4 ==, 5 !=, 6 member of the i-th
    NaN-delimited set of ``membership_values``) and go to the true or false branch, an interior node or a
    leaf as ``nodes_trueleafs``/``nodes_falseleafs`` say; a NaN feature goes to the true branch where
    ``nodes_missing_value_tracks_true`` is 1. Each tree (from ``tree_roots``) reaches one leaf, which adds
    ``leaf_weights`` to target ``leaf_targetids``; per target the trees' values aggregate by
    ``aggregate_function`` (0 average over all trees, 1 sum, 2 min, 3 max; a target no tree reached is 0),
    then ``post_transform`` (0 none, 1 softmax, 2 logistic, 3 softmax ignoring zeros, 4 probit) applies.
    ``nodes_splits``, ``leaf_weights`` and ``membership_values`` have X's element type."""

    aggregate_function: int = 1
    leaf_targetids: tuple[int, ...] | None = None
    leaf_weights: np.ndarray | None = None
    membership_values: np.ndarray | None = None
    n_targets: int | None = None
    nodes_falseleafs: tuple[int, ...] | None = None
    nodes_falsenodeids: tuple[int, ...] | None = None
    nodes_featureids: tuple[int, ...] | None = None
    nodes_hitrates: np.ndarray | None = None
    nodes_missing_value_tracks_true: tuple[int, ...] | None = None
    nodes_modes: np.ndarray | None = None
    nodes_splits: np.ndarray | None = None
    nodes_trueleafs: tuple[int, ...] | None = None
    nodes_truenodeids: tuple[int, ...] | None = None
    post_transform: int = 0
    tree_roots: tuple[int, ...] | None = None

    domain: ClassVar = ML
    since: ClassVar = 5
    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OPAQUE

    _NODE_LISTS: ClassVar = ("nodes_falseleafs", "nodes_falsenodeids", "nodes_featureids", "nodes_modes",
                             "nodes_splits", "nodes_trueleafs", "nodes_truenodeids")

    def validate(self):
        for name in self._NODE_LISTS + ("tree_roots", "leaf_targetids", "leaf_weights"):
            if getattr(self, name) is None:
                raise self.fail(f"attribute {name} is required")
        n = len(self.nodes_featureids)
        for name in self._NODE_LISTS + ("nodes_missing_value_tracks_true", "nodes_hitrates"):
            v = getattr(self, name)
            if v is not None and np.size(v) != n:
                raise self.fail(f"{name} has {np.size(v)} entries, nodes_featureids has {n} (all nodes_* must "
                                "have one entry per node)")
        nleaves = len(self.leaf_targetids)
        if self.leaf_weights.size != nleaves:
            raise self.fail(f"leaf_weights has {self.leaf_weights.size} entries, leaf_targetids {nleaves}")
        if not 0 <= self.aggregate_function < len(_AGGREGATES):
            raise self.fail(f"aggregate_function must be 0..3 ({', '.join(_AGGREGATES)}), got "
                            f"{self.aggregate_function}")
        if not 0 <= self.post_transform < len(_POST):
            raise self.fail(f"post_transform must be 0..4 ({', '.join(_POST)}), got {self.post_transform}")
        modes = self.modes()
        if modes.size and (modes.min() < 0 or modes.max() >= len(_BRANCH_MODES)):
            raise self.fail(f"nodes_modes must be 0..6 ({', '.join(_BRANCH_MODES)}), got {sorted(set(modes.tolist()))}")
        if not self.tree_roots:
            raise self.fail("tree_roots must name at least one tree")
        if min(self.tree_roots) < 0 or max(self.tree_roots) >= n:
            raise self.fail(f"tree_roots {list(self.tree_roots)} must index the {n} nodes")
        for flags, ids in (("nodes_trueleafs", "nodes_truenodeids"), ("nodes_falseleafs", "nodes_falsenodeids")):
            leaf = np.asarray(getattr(self, flags), dtype=bool)
            idx = np.asarray(getattr(self, ids), dtype=np.int64)
            bad = (leaf & ((idx < 0) | (idx >= nleaves))) | (~leaf & ((idx < 0) | (idx >= n)))
            if bad.any():
                raise self.fail(f"{ids}[{int(np.argmax(bad))}] = {int(idx[bad][0])} is out of range (there are "
                                f"{n} nodes and {nleaves} leaves)")
        if min(self.nodes_featureids, default=0) < 0:
            raise self.fail("nodes_featureids must be non-negative")
        if self.n_targets is not None and self.n_targets <= 0:
            raise self.fail(f"n_targets must be positive, got {self.n_targets}")
        targets = self.num_targets()
        if nleaves and (min(self.leaf_targetids) < 0 or max(self.leaf_targetids) >= targets):
            raise self.fail(f"leaf_targetids must lie in [0, n_targets={targets})")
        members = int((modes == 6).sum())
        if members and len(self.member_sets()) < members:
            raise self.fail(f"{members} BRANCH_MEMBER node(s) but membership_values holds "
                            f"{len(self.member_sets())} NaN-delimited set(s)")
        for name in ("nodes_splits", "leaf_weights", "membership_values"):
            v = getattr(self, name)
            if v is not None and DType.from_numpy(v.dtype) not in _TREE_TYPES:
                raise self.fail(f"{name} must be a float tensor (f16, f32, f64), got {DType.from_numpy(v.dtype)}")

    def modes(self) -> np.ndarray:
        return np.asarray(self.nodes_modes, dtype=np.int64).ravel()

    def num_targets(self) -> int:
        if self.n_targets is not None:
            return self.n_targets
        return max(self.leaf_targetids, default=0) + 1

    def member_sets(self) -> list[np.ndarray]:
        if self.membership_values is None:
            return []
        mv = np.asarray(self.membership_values, dtype=np.float64).ravel()
        cuts = np.nonzero(np.isnan(mv))[0]
        sets, start = [], 0
        for c in cuts:
            sets.append(mv[start:c])
            start = c + 1
        if start < mv.size:
            sets.append(mv[start:])
        return sets

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, _TREE_TYPES, "X")
        if x.type.rank != 2:
            raise self.fail(f"X must be 2-D [N, F], got {x.type}")
        for name in ("nodes_splits", "leaf_weights", "membership_values"):
            v = getattr(self, name)
            if v is not None and DType.from_numpy(v.dtype) is not x.dtype:
                raise self.fail(f"{name} has element type {DType.from_numpy(v.dtype)}, X has {x.dtype} "
                                "(they must match)")
        f = x.shape[1]
        if isinstance(f, int) and self.nodes_featureids and max(self.nodes_featureids) >= f:
            raise self.fail(f"nodes_featureids use feature {max(self.nodes_featureids)}, X has {f} features")
        return [TensorType(x.dtype, (x.shape[0], self.num_targets()))]

    def _leaves(self, x: np.ndarray) -> np.ndarray:
        """The leaf each tree reaches for each row: [N, trees]."""
        n = x.shape[0]
        modes = self.modes()
        feat = np.asarray(self.nodes_featureids, dtype=np.int64)
        split = np.asarray(self.nodes_splits, dtype=np.float64).ravel()
        tleaf = np.asarray(self.nodes_trueleafs, dtype=bool)
        fleaf = np.asarray(self.nodes_falseleafs, dtype=bool)
        tid = np.asarray(self.nodes_truenodeids, dtype=np.int64)
        fid = np.asarray(self.nodes_falsenodeids, dtype=np.int64)
        tracks = (np.asarray(self.nodes_missing_value_tracks_true, dtype=bool)
                  if self.nodes_missing_value_tracks_true is not None else np.zeros(len(feat), bool))
        # membership sets as a NaN-padded matrix, one row per BRANCH_MEMBER node in node order
        set_row = np.full(len(feat), -1, np.int64)
        member_nodes = np.nonzero(modes == 6)[0]
        set_row[member_nodes] = np.arange(member_nodes.size)
        sets = self.member_sets()[:member_nodes.size]
        width = max((s.size for s in sets), default=0)
        table = np.full((len(sets), max(width, 1)), np.nan)
        for i, s in enumerate(sets):
            table[i, :s.size] = s
        xs = x.astype(np.float64)
        trees = len(self.tree_roots)
        node = np.tile(np.asarray(self.tree_roots, dtype=np.int64), (n, 1))
        leaf = np.full((n, trees), -1, np.int64)
        rows = np.repeat(np.arange(n), trees).reshape(n, trees)
        active = np.ones((n, trees), bool)
        for _ in range(len(feat) + 1):
            if not active.any():
                break
            nd = node[active]
            v = xs[rows[active], feat[nd]]
            th = split[nd]
            m = modes[nd]
            with np.errstate(invalid="ignore"):
                cond = np.select([m == 0, m == 1, m == 2, m == 3, m == 4, m == 5],
                                 [v <= th, v < th, v >= th, v > th, v == th, v != th], default=False)
            member = m == 6
            if member.any():
                cond[member] = (table[set_row[nd[member]]] == v[member, None]).any(axis=1)
            cond |= np.isnan(v) & tracks[nd]
            to_leaf = np.where(cond, tleaf[nd], fleaf[nd])
            nxt = np.where(cond, tid[nd], fid[nd])
            node[active] = nxt
            done = np.zeros_like(active)
            done[active] = to_leaf
            leaf[done] = node[done]
            active &= ~done
        if active.any():
            raise ValueError("TreeEnsemble: a tree does not reach a leaf (the nodes form a cycle)")
        return leaf

    def compute(self, x):
        n = x.shape[0]
        targets = self.num_targets()
        leaf = self._leaves(x)
        tgt = np.asarray(self.leaf_targetids, dtype=np.int64)[leaf]
        w = np.asarray(self.leaf_weights, dtype=np.float64).ravel()[leaf]
        flat = (np.arange(n)[:, None] * targets + tgt).ravel()
        agg = _AGGREGATES[self.aggregate_function]
        if agg in ("SUM", "AVERAGE"):
            y = np.bincount(flat, weights=w.ravel(), minlength=n * targets)
            if agg == "AVERAGE":
                y = y / leaf.shape[1]
        else:
            y = np.full(n * targets, np.inf if agg == "MIN" else -np.inf)
            (np.minimum if agg == "MIN" else np.maximum).at(y, flat, w.ravel())
            y[np.isinf(y) & (np.bincount(flat, minlength=n * targets) == 0)] = 0.0
        y = y.reshape(n, targets)
        y = self._post(y)
        return [y.astype(x.dtype)]

    def _post(self, y: np.ndarray) -> np.ndarray:
        post = _POST[self.post_transform]
        if post == "SOFTMAX":
            e = np.exp(y - y.max(axis=1, keepdims=True)) if y.size else y
            return e / e.sum(axis=1, keepdims=True)
        if post == "LOGISTIC":
            return 1.0 / (1.0 + np.exp(-y))
        if post == "SOFTMAX_ZERO":
            if not y.size:
                return y
            nz = y != 0
            e = np.where(nz, np.exp(y - y.max(axis=1, keepdims=True)), 0.0)
            s = e.sum(axis=1, keepdims=True)
            return np.divide(e, s, out=np.zeros_like(e), where=s > 0)
        if post == "PROBIT":
            return np.sqrt(2.0) * _erfinv(2.0 * y - 1.0)
        return y

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        n = ins[0].shape[0]
        depth = len(self.nodes_featureids)
        return Cost((n if isinstance(n, int) else 0) * len(self.tree_roots) * min(depth, 32), base.bytes)


# ---------------------------------------------------------------------------------------------
# ArrayFeatureExtractor, Binarizer
# ---------------------------------------------------------------------------------------------

_AFE_TYPES = frozenset({DType.f32, DType.f64, DType.i64, DType.i32, DType.string})


@dataclass(frozen=True, eq=False)
class ArrayFeatureExtractor(OpDef):
    """Selects entries of X's last axis: Z = X[..., Y.ravel()] (Y int64 indices in [0, F)); a 1-D X gives
    a [1, len(Y)] result."""

    domain: ClassVar = ML
    since: ClassVar = 1
    inputs: ClassVar = ("X", "Y")
    outputs: ClassVar = ("Z",)
    pattern: ClassVar = Pattern.INJECTIVE

    def infer(self, ins):
        x, y = ins
        check_dtype(self, x, _AFE_TYPES, "X")
        check_dtype(self, y, {DType.i64}, "Y (the indices)")
        if x.type.rank == 0:
            raise self.fail(f"X must have rank >= 1, got {x.type}")
        idx = known_ints(y)
        f = x.shape[-1]
        if idx is not None and isinstance(f, int) and any(not 0 <= i < f for i in idx):
            raise self.fail(f"indices {idx} out of range for the last axis of X {x.type} (0 to {f - 1})")
        k = num_elements(y.shape)
        lead = (1,) if x.type.rank == 1 else x.shape[:-1]
        return [TensorType(x.dtype, lead + (k,))]

    def compute(self, x, y):
        idx = y.ravel()
        f = x.shape[-1]
        if idx.size and (idx.min() < 0 or idx.max() >= f):
            raise ValueError(f"indices {idx.tolist()} out of range for the last axis of X (size {f})")
        if x.ndim == 1:
            x = x[None, :]
        return [np.ascontiguousarray(x[..., idx])]


@dataclass(frozen=True, eq=False)
class Binarizer(OpDef):
    """Y = 1 where X > threshold, else 0 (X's element type)."""

    threshold: float = 0.0

    domain: ClassVar = ML
    since: ClassVar = 1
    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.ELEMWISE

    def infer(self, ins):
        (x,) = ins
        check_dtype(self, x, {DType.f32, DType.f64, DType.i64, DType.i32}, "X")
        return [x.type]

    def compute(self, x):
        return [(x > self.threshold).astype(x.dtype)]


# ---------------------------------------------------------------------------------------------
# TfIdfVectorizer
# ---------------------------------------------------------------------------------------------

_MODES = ("TF", "IDF", "TFIDF")


@dataclass(frozen=True, eq=False)
class TfIdfVectorizer(OpDef):
    """Counts the n-grams of the pool in each row of X (1-D [C] or 2-D [N, C]): Y [max(ngram_indexes)+1]
    or [N, max(ngram_indexes)+1], f32. The pool (``pool_int64s`` for integer X, ``pool_strings`` for
    string X) holds the 1-grams, then the 2-grams, ... from the offsets ``ngram_counts``; the i-th n-gram
    counts into Y[ngram_indexes[i]]. n-grams of length ``min_gram_length`` to ``max_gram_length`` are
    taken with every skip 0..``max_skip_count`` between their items (1-grams once). Mode TF gives counts
    (n-grams sharing an output coordinate add up there), IDF ``weights[i]`` where the count is non-zero,
    TFIDF counts times ``weights`` (default all ones): weight i is the i-th n-gram's, as ONNX Runtime
    reads them (ONNX's reference evaluator reads them by output coordinate)."""

    max_gram_length: int | None = None
    max_skip_count: int | None = None
    min_gram_length: int | None = None
    mode: str | None = None
    ngram_counts: tuple[int, ...] | None = None
    ngram_indexes: tuple[int, ...] | None = None
    pool_int64s: tuple[int, ...] | None = None
    pool_strings: tuple[str, ...] | None = None
    weights: tuple[float, ...] | None = None

    since: ClassVar = 9
    inputs: ClassVar = ("X",)
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OPAQUE

    def validate(self):
        for name in ("max_gram_length", "max_skip_count", "min_gram_length", "mode", "ngram_counts",
                     "ngram_indexes"):
            if getattr(self, name) is None:
                raise self.fail(f"attribute {name} is required")
        if self.mode not in _MODES:
            raise self.fail(f"mode must be one of {', '.join(_MODES)}, got {self.mode!r}")
        if not 1 <= self.min_gram_length <= self.max_gram_length:
            raise self.fail(f"need 1 <= min_gram_length <= max_gram_length, got {self.min_gram_length} and "
                            f"{self.max_gram_length}")
        if self.max_skip_count < 0:
            raise self.fail(f"max_skip_count must be >= 0, got {self.max_skip_count}")
        if (self.pool_int64s is None) == (self.pool_strings is None):
            raise self.fail("exactly one of pool_int64s and pool_strings must be set")
        size = len(self.pool())
        counts = list(self.ngram_counts)
        if any(b < a for a, b in zip(counts, counts[1:])) or (counts and (counts[0] < 0 or counts[-1] > size)):
            raise self.fail(f"ngram_counts {counts} must be non-decreasing offsets into the pool of {size} items")
        total = 0
        for n, (start, end) in enumerate(self._levels(), start=1):
            if (end - start) % n:
                raise self.fail(f"the pool's {n}-gram section [{start}, {end}) does not hold whole {n}-grams")
            total += (end - start) // n
        if len(self.ngram_indexes) != total:
            raise self.fail(f"ngram_indexes has {len(self.ngram_indexes)} entries, the pool holds {total} n-grams")
        if self.ngram_indexes and min(self.ngram_indexes) < 0:
            raise self.fail("ngram_indexes must be non-negative")
        if self.weights is not None and len(self.weights) != total:
            raise self.fail(f"weights has {len(self.weights)} entries, ngram_indexes {total}")
        if self.mode != "TF" and len(set(self.ngram_indexes)) < total:
            raise self.fail(f"ngram_indexes {list(self.ngram_indexes)} give several n-grams one output coordinate: "
                            f"in mode {self.mode} ONNX Runtime and ONNX's reference compute that differently "
                            "(supported in mode TF, where their counts add up)")

    def pool(self) -> tuple:
        return self.pool_int64s if self.pool_int64s is not None else self.pool_strings

    def _levels(self) -> list[tuple[int, int]]:
        """[start, end) of the pool's n-grams for n = 1, 2, ..."""
        counts = list(self.ngram_counts)
        ends = counts[1:] + [len(self.pool())]
        return list(zip(counts, ends))

    def output_size(self) -> int:
        return max(self.ngram_indexes, default=-1) + 1

    def infer(self, ins):
        (x,) = ins
        if self.pool_strings is not None:
            check_dtype(self, x, {DType.string}, "X (pool_strings is set)")
        else:
            check_dtype(self, x, {DType.i32, DType.i64}, "X (pool_int64s is set)")
        if x.type.rank not in (1, 2):
            raise self.fail(f"X must be 1-D [C] or 2-D [N, C], got {x.type}")
        lead = x.shape[:-1]
        return [TensorType(DType.f32, lead + (self.output_size(),))]

    def compute(self, x):
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        nrows, c = rows.shape
        pool = self.pool()
        # tokens -> ids into the pool's vocabulary (unknown tokens get len(vocab))
        if self.pool_strings is not None:
            vocab = {s: i for i, s in enumerate(dict.fromkeys(pool))}
            unknown = len(vocab)
            ids = np.array([vocab.get(s, unknown) for s in rows.ravel().tolist()], np.int64).reshape(rows.shape)
            pool_ids = np.array([vocab[s] for s in pool], np.int64)
        else:
            vocab_arr = np.unique(np.asarray(pool, dtype=np.int64))
            unknown = vocab_arr.size
            tok = rows.astype(np.int64)
            pos = np.clip(np.searchsorted(vocab_arr, tok), 0, max(unknown - 1, 0))
            ids = np.where(vocab_arr[pos] == tok, pos, unknown) if unknown else np.full(tok.shape, 0)
            pool_ids = np.searchsorted(vocab_arr, np.asarray(pool, dtype=np.int64))
        total = len(self.ngram_indexes)
        counts = np.zeros((nrows, total), np.float64)
        first = 0  # index of the level's first n-gram among all n-grams
        for n, (start, end) in enumerate(self._levels(), start=1):
            grams = pool_ids[start:end].reshape(-1, n)
            if self.min_gram_length <= n <= self.max_gram_length and grams.size:
                wins = []
                for skip in range(self.max_skip_count + 1 if n > 1 else 1):
                    span = (n - 1) * (skip + 1) + 1
                    if span > c:
                        break
                    at = np.arange(c - span + 1)[:, None] + np.arange(n) * (skip + 1)
                    wins.append(ids[:, at])  # [rows, positions, n]
                if wins:
                    win = np.concatenate(wins, axis=1)
                    npos = win.shape[1]
                    both = np.concatenate([grams, win.reshape(-1, n)])
                    _, code = np.unique(both, axis=0, return_inverse=True)
                    code = code.ravel()
                    lookup = np.full(code.max() + 1, -1, np.int64)
                    g = grams.shape[0]
                    lookup[code[:g][::-1]] = np.arange(g)[::-1]  # the first of repeated pool n-grams
                    match = lookup[code[g:]].reshape(nrows, npos)
                    r, p = np.nonzero(match >= 0)
                    np.add.at(counts, (r, first + match[r, p]), 1.0)
            first += grams.shape[0]
        w = np.ones(total) if self.weights is None else np.asarray(self.weights, dtype=np.float64)
        if self.mode == "TF":
            vals = counts
        elif self.mode == "IDF":
            vals = (counts > 0) * w
        else:
            vals = counts * w
        out = np.zeros((nrows, self.output_size()), np.float64)
        for j, slot in enumerate(self.ngram_indexes):  # n-grams sharing a coordinate (TF only) add up there
            out[:, slot] += vals[:, j]
        return [out.astype(np.float32).reshape(x.shape[:-1] + (self.output_size(),))]


OPS = (LabelEncoder, TreeEnsemble, ArrayFeatureExtractor, Binarizer, TfIdfVectorizer)
