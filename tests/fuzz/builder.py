"""The builder of random ONNX graphs the generator's recipes use (``recipes.py``): random dims and
shapes, graph inputs with their feeds, constants and weights, nodes, picking an earlier value, and
``apply`` (a recipe, then ONNX's strict shape inference on the new values; a failure rolls it back)."""
from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
MAX_ELEMENTS = 1 << 16          # per value, to keep each model fast to compile and run
STATS: collections.Counter = collections.Counter()   # rolled-back recipes and discarded models, by reason


@dataclasses.dataclass
class Val:
    shape: tuple
    dtype: int
    exact: bool = False     # a graph input or data movement of one: safe to compare, cast, floor
    scale: float = 1.0      # a rough bound of |value|, to keep Exp and Pow finite

class Skip(Exception):
    """The recipe does not apply to what was picked."""


class Builder:
    def __init__(self, rng: np.random.Generator, zero_dims: bool = False):
        self.rng, self.zero = rng, zero_dims
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.feeds: dict = {}
        self.vals: dict[str, Val] = {}
        self.order: list[str] = []      # candidate values, oldest first
        self.recipes: list[str] = []
        self.pending: dict[str, tuple] = {}  # new node outputs -> (exact, scale)
        self.n = 0

    # -- randomness ----------------------------------------------------------------------------
    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def int(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""
        return int(self.rng.integers(lo, hi + 1))

    def choice(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def dim(self, lo: int = 1) -> int:
        r = self.rng.random()
        if self.zero and lo == 0 and r < 0.15:
            return 0
        if r < 0.25:
            return max(lo, 1)
        return self.int(2, 7) if r < 0.9 else self.int(8, 33)

    def shape(self, rank: int) -> tuple:
        return tuple(self.dim(0) for _ in range(rank))

    def bcast_shape(self, shape: tuple) -> tuple:
        """A shape that broadcasts with ``shape``: a suffix of it with some dims 1, sometimes with a
        new leading dim or a 1 of ``shape`` widened (both widen the result)."""
        r = self.int(0, len(shape))
        out = [1 if self.chance(0.3) else d for d in shape[len(shape) - r:]]
        if out and self.chance(0.15):
            ones = [i for i, d in enumerate(shape[len(shape) - r:]) if d == 1]
            if ones:
                out[self.choice(ones)] = self.int(2, 4)
        if len(shape) < 4 and self.chance(0.15):
            out = [self.int(2, 3)] + [d for d in shape]
        return tuple(out)

    # -- building --------------------------------------------------------------------------------
    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def input(self, shape, dtype=F32) -> str:
        name = self.name("in")
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        if dtype == F32:
            data = self.rng.standard_normal(shape).astype(np.float32)
        elif dtype == I64:
            data = self.rng.integers(0, 5, shape).astype(np.int64)
        else:
            data = self.rng.random(shape) < 0.5
        self.feeds[name] = np.asarray(data)
        self.vals[name] = Val(tuple(shape), dtype, True, 3.0)
        self.order.append(name)
        return name

    def const(self, arr, base: str = "c") -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(values, np.int64), "i")

    def weight(self, shape, fan_in: int | None = None, scale: float = 1.0) -> str:
        fan_in = fan_in if fan_in is not None else (shape[0] if shape else 1)
        std = scale / math.sqrt(max(fan_in, 1))
        return self.const(self.rng.standard_normal(shape).astype(np.float32) * np.float32(std), "w")

    def scalar(self, value: float) -> str:
        return self.const(np.float32(value), "k")

    def node(self, op: str, inputs, n_out: int = 1, exact: bool = False, scale: float | None = None,
             **attrs):
        outs = [self.name(op[:4].lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=self.name(op + "_"), **attrs))
        if scale is None:
            scale = max([self.vals[i].scale for i in inputs if i in self.vals] or [1.0])
        for o in outs:
            self.pending[o] = (exact, scale)
        return outs[0] if n_out == 1 else outs

    def pick(self, ranks=range(0, 5), dtype=F32, pred=None, new_prob: float = 0.2, shape=None) -> str:
        """An existing value (recent ones more likely) of a rank in ``ranks``, or a new graph input
        (of ``shape()`` if given)."""
        cands = [n for n in self.order if self.vals[n].dtype == dtype and len(self.vals[n].shape) in ranks
                 and (pred is None or pred(self.vals[n]))]
        if cands and not self.chance(new_prob):
            w = np.arange(1, len(cands) + 1, dtype=np.float64) ** 2
            return cands[int(self.rng.choice(len(cands), p=w / w.sum()))]
        shp = shape() if shape else self.shape(self.choice(list(ranks)))
        if not (pred is None or pred(Val(tuple(shp), dtype, True))):
            raise Skip("no value fits")
        return self.input(shp, dtype)

    def same_shape(self, shape, avoid=()) -> str:
        """A value of exactly ``shape``: an existing one, or a new input."""
        cands = [n for n in self.order if self.vals[n].shape == tuple(shape) and self.vals[n].dtype == F32
                 and n not in avoid]
        if cands and self.chance(0.7):
            return self.choice(cands)
        return self.input(shape)

    def v(self, name: str) -> Val:
        return self.vals[name]

    # -- recipes: apply, infer, roll back --------------------------------------------------------
    def apply(self, recipe) -> bool:
        snap = (len(self.nodes), len(self.inits), len(self.inputs), list(self.order), dict(self.vals),
                dict(self.feeds), self.n)
        self.pending = {}
        try:
            tag = recipe(self)
            if len(self.nodes) == snap[0] or not self._infer():
                raise Skip("shape inference")
        except Skip:
            STATS[f"rolled back: {recipe.__name__}"] += 1
            nn, ni, nin, order, vals, feeds, n = snap
            del self.nodes[nn:], self.inits[ni:], self.inputs[nin:]
            self.order, self.vals, self.feeds, self.n = order, vals, feeds, n
            return False
        self.recipes.append(tag or recipe.__name__[2:])
        return True

    def model(self, outputs=()) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, "fuzz", self.inputs, list(outputs), self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)

    def _infer(self) -> bool:
        try:
            m = onnx.shape_inference.infer_shapes(self.model(), check_type=True, strict_mode=True,
                                                  data_prop=True)
        except Exception:
            return False
        types = {vi.name: vi.type for vi in m.graph.value_info}
        new = {}
        for name, (exact, scale) in self.pending.items():
            t = types.get(name)
            if t is None or t.WhichOneof("value") != "tensor_type":
                return False
            tt = t.tensor_type
            if not tt.HasField("shape") or any(not d.HasField("dim_value") for d in tt.shape.dim):
                return False
            shape = tuple(int(d.dim_value) for d in tt.shape.dim)
            if int(np.prod(shape)) > MAX_ELEMENTS or (0 in shape and not self.zero) or any(d < 0 for d in shape):
                return False
            new[name] = Val(shape, tt.elem_type, exact, min(scale, 1e6))
        for name, val in new.items():
            self.vals[name] = val
            if val.dtype in (F32, I64, BOOL):
                self.order.append(name)
        self.pending = {}
        return True
