"""The base of every op definition.

An op definition is a frozen dataclass whose fields are its attributes (named as in ONNX), validated
and normalized when it is built. Each op class says, in one place:

* its signature: ``inputs`` / ``outputs`` name the operands (``"B?"`` optional, ``"xs*"`` variadic);
* ``infer``: the result types from the input values (their types, and ``known`` small values);
* ``compute``: the NumPy reference semantics, Kiln's definition of correct;
* ``pattern``: how it fuses (elementwise, broadcast, injective, reduce, out-elementwise-fusable, opaque);
* ``cost``: FLOPs and bytes moved, for a node with given input/output types.
"""
from __future__ import annotations

import dataclasses
import enum
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from ..graph import KNOWN_VALUE_LIMIT, Graph, Value
from ..types import DType, TensorType


class OpError(ValueError):
    """An op built with bad attributes, or applied to inputs it does not accept."""


class Pattern(enum.IntEnum):
    """Fusion pattern classes, in TVM's order: a group's pattern is the max of its members'."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4
    OPAQUE = 8


@dataclass(frozen=True)
class Cost:
    flops: int
    bytes: int


FLOATS = frozenset(d for d in DType if d.is_float)
INTS = frozenset(d for d in DType if d.is_int)
NUMERIC = FLOATS | INTS
ANY = frozenset(DType)
STD_FLOATS = frozenset({DType.f16, DType.bf16, DType.f32, DType.f64})
STD_INTS = frozenset({DType.i8, DType.i16, DType.i32, DType.i64, DType.u8, DType.u16, DType.u32, DType.u64})
STD_NUMERIC = STD_FLOATS | STD_INTS

_MISSING = dataclasses.MISSING


@dataclass(frozen=True, eq=False)
class OpDef:
    """Base of all op definitions (see the module docstring)."""

    name: ClassVar[str] = ""
    domain: ClassVar[str] = ""
    #: the ONNX opset whose signature this IR form follows
    since: ClassVar[int] = 1
    inputs: ClassVar[tuple[str, ...]] = ("X",)
    outputs: ClassVar[tuple[str, ...]] = ("Y",)
    pattern: ClassVar[Pattern] = Pattern.OPAQUE
    #: whether compute() is deterministic and cheap enough to run on known values at compile time
    foldable: ClassVar[bool] = True
    #: IR field -> ONNX attribute name, where they differ (an ONNX name taken by a class attribute,
    #: like RegexFullMatch's ``pattern``); the importer and exporter rename through it
    onnx_attr_names: ClassVar[dict[str, str]] = {}
    #: whether every input must be a tensor (``infer_node`` refuses a sequence or an optional); the
    #: sequence and optional ops, and Identity, set it False and check their inputs themselves
    tensors_only: ClassVar[bool] = True
    #: inputs that are parameters rather than data (attributes that ONNX turned into inputs: an
    #: axis, a diagonal offset): native code needs their values, so a model that feeds them as
    #: graph inputs is compiled for the values given (``shape_determining_inputs``)
    parameters: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__
        # keep OpDef's repr: @dataclass on the subclass would otherwise generate one
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = OpDef.__repr__

    def __post_init__(self):
        for f, hint in _attr_hints(type(self)).items():
            try:
                object.__setattr__(self, f, _coerce(getattr(self, f), hint))
            except (TypeError, ValueError) as e:
                raise OpError(f"{self.name}: attribute {f}={getattr(self, f)!r}: {e}") from None
        self.validate()

    # -- to override ---------------------------------------------------------------------------
    def validate(self) -> None:
        """Check attribute values; raise OpError naming the attribute."""

    def infer(self, ins: Sequence[Value | None]) -> list[TensorType]:
        raise NotImplementedError(f"{self.name} has no type inference")

    def compute(self, *xs: np.ndarray | None) -> Sequence[np.ndarray]:
        raise NotImplementedError(f"{self.name} has no reference implementation")

    def propagate(self, ins: Sequence[Value | None], types: Sequence[TensorType]) -> list[np.ndarray | None]:
        """Compile-time known results (for shape inference): by default, compute() on known inputs."""
        none = [None] * len(types)
        if not self.foldable or not all(t.is_static and t.numel <= KNOWN_VALUE_LIMIT for t in types):
            return none
        if any(v is not None and v.known is None for v in ins):
            return none
        try:
            outs = self.compute(*[None if v is None else v.known for v in ins])
        except Exception:  # inference must not fail because a value could not be precomputed
            return none
        return [np.asarray(o) for o in outs[: len(types)]]

    def cost(self, ins: Sequence[TensorType | None], outs: Sequence[TensorType]) -> Cost:
        flops = sum(t.numel or 0 for t in outs)
        moved = sum((t.nbytes or 0) for t in list(ins) + list(outs) if t is not None)
        return Cost(flops, moved)

    # -- attributes ----------------------------------------------------------------------------
    def attributes(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def non_default_attributes(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            default = f.default if f.default is not _MISSING else (
                f.default_factory() if f.default_factory is not _MISSING else _MISSING)
            if default is _MISSING or not _same(v, _coerce(default, _attr_hints(type(self))[f.name])):
                out[f.name] = v
        return dict(sorted(out.items()))

    def replace(self, **changes) -> "OpDef":
        return dataclasses.replace(self, **changes)

    def key(self) -> tuple:
        """A hashable identity of op and attributes (for CSE and equality)."""
        return (type(self),) + tuple(_hashable(getattr(self, f.name)) for f in dataclasses.fields(self))

    def __eq__(self, other) -> bool:
        return isinstance(other, OpDef) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.non_default_attributes().items())
        return f"{self.name}({attrs})"

    # -- signature helpers ---------------------------------------------------------------------
    @classmethod
    def arity(cls) -> tuple[int, int | None]:
        """(minimum, maximum) number of inputs; maximum None when variadic."""
        required = sum(1 for s in cls.inputs if not s.endswith(("?", "*")))
        variadic = any(s.endswith("*") for s in cls.inputs)
        return required, None if variadic else len(cls.inputs)

    def fail(self, msg: str) -> OpError:
        return OpError(f"{self.name}: {msg}")


# ---------------------------------------------------------------------------------------------
# Building nodes
# ---------------------------------------------------------------------------------------------

def check_arity(op: OpDef, ins: Sequence[Value | None]) -> None:
    lo, hi = op.arity()
    n = len(ins)
    if n < lo or (hi is not None and n > hi):
        want = f"{lo}" if lo == hi else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
        raise op.fail(f"takes {want} inputs ({', '.join(op.inputs)}), got {n}")
    for i, v in enumerate(ins):
        spec = op.inputs[min(i, len(op.inputs) - 1)]
        if v is None and not spec.endswith(("?", "*")):
            raise op.fail(f"required input {i} ({spec}) is missing")
        if op.tensors_only and v is not None and not isinstance(v.type, TensorType):
            raise op.fail(f"input {i} ({spec.rstrip('?*')}) is a {v.type} value; {op.name} takes tensors")


def infer_node(op: OpDef, ins: Sequence[Value | None], num_outputs: int | None = None):
    """Result types and known values of ``op`` applied to ``ins`` (the first ``num_outputs``)."""
    check_arity(op, ins)
    types = list(op.infer(ins))
    if num_outputs is not None:
        if num_outputs > len(types):
            raise op.fail(f"produces {len(types)} results, {num_outputs} requested")
        types = types[:num_outputs]
    known = op.propagate(ins, types)
    return types, known


# ---------------------------------------------------------------------------------------------
# Attribute coercion: the annotation of each dataclass field says what it holds
# ---------------------------------------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}


def _attr_hints(cls) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        allh = typing.get_type_hints(cls)
        hints = {f.name: allh[f.name] for f in dataclasses.fields(cls)}
        _HINTS[cls] = hints
    return hints


_GRAPH_FIELDS: dict[type, tuple[str, ...]] = {}


def graph_fields(cls) -> tuple[str, ...]:
    """The names of the fields of op class ``cls`` that hold subgraphs (annotated ``Graph``)."""
    names = _GRAPH_FIELDS.get(cls)
    if names is None:
        names = tuple(f for f, h in _attr_hints(cls).items()
                      if h is Graph or Graph in typing.get_args(h))
        _GRAPH_FIELDS[cls] = names
    return names


def _coerce(value, hint):
    if value is None:
        args = typing.get_args(hint)
        if type(None) in args or hint is Any:
            return None
        raise TypeError("must not be None")
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is getattr(__import__("types"), "UnionType", None):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        errors = []
        for a in args:
            try:
                return _coerce(value, a)
            except (TypeError, ValueError) as e:
                errors.append(str(e))
        raise TypeError("; ".join(errors))
    if origin is tuple:
        (elem, *_rest) = typing.get_args(hint)
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        return tuple(_coerce(v, elem) for v in value)
    if hint is bool:
        if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
            return bool(value)
        raise TypeError(f"expected a bool, got {value!r}")
    if hint is int:
        if isinstance(value, (bool, np.bool_)):
            return int(value)
        if isinstance(value, (int, np.integer)):
            return int(value)
        raise TypeError(f"expected an int, got {type(value).__name__}")
    if hint is float:
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
            return float(value)
        raise TypeError(f"expected a float, got {type(value).__name__}")
    if hint is str:
        if isinstance(value, bytes):
            return value.decode("utf-8")
        if isinstance(value, str):
            return value
        raise TypeError(f"expected a string, got {type(value).__name__}")
    if hint is DType:
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            return DType.parse(value)
        if isinstance(value, (int, np.integer)):
            return DType.from_onnx(int(value))
        raise TypeError(f"expected an element type, got {value!r}")
    if hint is np.ndarray:
        arr = np.asarray(value)
        if arr.dtype.kind in "US":
            arr = arr.astype(object)
        arr.setflags(write=False)
        return arr
    if hint is Graph:  # a subgraph (control flow: If's branches, Loop's and Scan's body), held as is
        if isinstance(value, Graph):
            return value
        raise TypeError(f"expected a graph (a subgraph), got {type(value).__name__}")
    if hint is Any:
        return value
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    raise TypeError(f"cannot hold {value!r} as {hint}")


def _hashable(v):
    if isinstance(v, Graph):
        # a subgraph compares by identity: two nodes with different bodies (even bodies that print the
        # same, as large constants print without their data) are never equal, so CSE never merges them
        return ("graph", v)  # Graph keeps object identity for == and hash
    if isinstance(v, np.ndarray):
        return ("ndarray", v.dtype.str, v.shape, v.tobytes() if v.dtype != object else tuple(v.ravel()))
    if isinstance(v, float) and v != v:
        return ("nan",)
    return v


def _same(a, b) -> bool:
    return _hashable(a) == _hashable(b)


# ---------------------------------------------------------------------------------------------
# Helpers for inference
# ---------------------------------------------------------------------------------------------

def broadcast_dims(a, b):
    """One broadcast dimension (numpy rules; symbolic dims kept when they agree)."""
    if a == 1:
        return b
    if b == 1:
        return a
    if a == b:
        return a
    if isinstance(a, int) and isinstance(b, int):
        raise OpError(f"dimensions {a} and {b} do not broadcast")
    if isinstance(a, int):  # b symbolic/unknown: result must equal a (or b is 1)
        return a
    if isinstance(b, int):
        return b
    return None


def broadcast_shapes(*shapes) -> tuple:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        padded = (1,) * (rank - len(s)) + tuple(s)
        out = [broadcast_dims(x, y) for x, y in zip(out, padded)]
    return tuple(out)


def norm_axis(op: OpDef, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise op.fail(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def known_ints(v: Value | None) -> list[int] | None:
    """The known integer contents of a value, or None."""
    if v is None or v.known is None:
        return None
    return [int(x) for x in np.asarray(v.known).ravel()]


def same_dtype(op: OpDef, ins: Sequence[Value | None], allowed=ANY) -> DType:
    """All present inputs share one element type from ``allowed``; return it."""
    dts = {v.dtype for v in ins if v is not None}
    if len(dts) != 1:
        raise op.fail(f"inputs must share one element type, got {', '.join(sorted(str(d) for d in dts))}")
    (dt,) = dts
    if dt not in allowed:
        raise op.fail(f"element type {dt} is not supported (supported: "
                      f"{', '.join(sorted(d.short for d in allowed))})")
    return dt


def check_dtype(op: OpDef, v: Value, allowed, what: str = "input") -> DType:
    if v.dtype not in allowed:
        raise op.fail(f"{what} has element type {v.dtype}, supported: "
                      f"{', '.join(sorted(d.short for d in allowed))}")
    return v.dtype


def unknown_dims(rank: int) -> tuple:
    return (None,) * rank
