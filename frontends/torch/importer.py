"""An ATen-level FX graph to a Kiln graph: ``import_fx(gm, example_inputs, constants)``.

Placeholders become graph inputs (shapes from the example inputs), except those in ``constants``
(parameters and buffers, frozen at compile time), which become constants; each ``call_function`` node
goes through its lowering in ``lowerings.LOWERINGS``; ``getitem`` picks a result of a multi-result
node; the output node's values become the graph's outputs, in order.

Sizes known only at run time: a graph traced with dynamo's symbolic sizes (``torch.compile(...,
dynamic=True)``, ``mark_dynamic``) has example inputs (fake tensors) whose sizes are ``SymInt``s. Such
a size becomes a symbolic dimension of Kiln's IR, named after its symbol (``s0``; an expression such as
``2*s0`` gets a name of its own, ``e_2_s0``), as an ONNX model's ``N`` is. The size placeholders
(``s0: SymInt``) and arithmetic on sizes lower to nothing (``SIZE``): lowerings read sizes from the
nodes' shapes (``Lowerer.meta_shape``), never from such a value, and one that needs a static size
refuses with ``Unsupported``. No size is ever read off an example: a compile is exact for every size.
"""
from __future__ import annotations

import operator
import re
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from compiler.errors import ModelError
from compiler.ir.graph import Graph, Value
from compiler.ir.types import TensorType

from .lowerings import DTYPES, LOWERINGS, SIZE, Unsupported, op


#: multi-result ATen ops whose first result alone is lowered (statistics and indices are not)
FIRST_RESULT_ONLY = (torch.ops.aten.max_pool2d_with_indices.default, torch.ops.aten.native_layer_norm.default,
                     torch.ops.aten._native_batch_norm_legit_no_training.default,
                     torch.ops.aten.native_batch_norm.default, torch.ops.aten.native_group_norm.default)


def supported(node: torch.fx.Node) -> str | None:
    """None when ``node`` (a call_function) has a lowering that takes it, else why not."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        src = node.args[0]
        if isinstance(src, torch.fx.Node) and src.target in FIRST_RESULT_ONLY and node.args[1] != 0:
            return f"{src.target} result {node.args[1]} (only the first is lowered)"
        return None
    if node.target not in LOWERINGS:
        return f"no Kiln lowering for {node.target}"
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    for v in vals:
        if isinstance(v, torch.Tensor) and v.dtype not in DTYPES:
            return f"{node.target} makes {v.dtype}, which Kiln's IR does not hold"
    return None


def size_of(d) -> int | str:
    """A size of a (fake) tensor: an int, or the name of a size known only at run time (see the module
    docstring). A symbol the trace has pinned to a number (a guard) is that number."""
    if not isinstance(d, torch.SymInt):
        return int(d)
    expr = d.node.shape_env.simplify(d.node.expr) if d.node.shape_env is not None else d.node.expr
    if expr.is_number:
        return int(expr)
    if expr.is_Symbol:
        return str(expr)
    return "e_" + re.sub(r"\W+", "_", str(expr)).strip("_")


def sizes_of(t) -> tuple:
    return tuple(size_of(d) for d in t.shape)


class Lowerer:
    """The state of one import: FX node -> Kiln value(s)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.values: dict[Any, Any] = {}
        self.sizes: dict[str, Value] = {}  # sizes known only at run time, computed (``size``)
        self.symints: dict[Any, Any] = {}  # size placeholders -> their SymInt (a partition's have no meta)

    # -- what lowerings use ----------------------------------------------------------------------
    def meta_shape(self, arg) -> list[int | str]:
        """``arg``'s sizes: ints, and names where a size is known only at run time (``size_of``)."""
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if isinstance(val, torch.Tensor):
            return list(sizes_of(val))
        v = self.values.get(arg)
        if isinstance(v, Value) and None not in v.shape:
            return list(v.shape)
        raise Unsupported(f"no shape for {arg}")

    def static_shape(self, arg) -> list[int]:
        """``arg``'s sizes, which this lowering needs at compile time (``Unsupported`` otherwise)."""
        shape = self.meta_shape(arg)
        if not all(isinstance(d, int) for d in shape):
            raise Unsupported(f"{getattr(arg, 'name', arg)}: its sizes {shape} are known only at run time, and "
                              f"this lowering needs them when compiling")
        return shape

    def static_dim(self, arg, axis: int) -> int:
        d = self.meta_shape(arg)[axis]
        if not isinstance(d, int):
            raise Unsupported(f"{getattr(arg, 'name', arg)}: its size {d} on axis {axis} is known only at run "
                              f"time, and this lowering needs it when compiling")
        return d

    def reshape_operand(self, x: Value, src: Sequence, node: torch.fx.Node) -> Value:
        """The shape operand of a Reshape of ``x`` (sizes ``src``, as ``meta_shape`` gives them) to
        the sizes of ``node``'s result: a constant where the sizes known only at run time are those of
        ``x`` at the same index (0: copy it) or one of them is new (-1: inferred); else built when the
        model runs, each such size read off ``x``'s shape where ``x`` has it, else computed (``size``)."""
        sizes = list(node.meta["val"].shape)
        out = [size_of(d) for d in sizes]
        if all(isinstance(d, int) for d in out):
            return self.const(np.asarray(out, np.int64))
        if 0 in out:  # (a 0 in the operand copies the input's size)
            raise Unsupported(f"a reshape to {out}: a zero size beside sizes known only at run time")
        src = list(src)
        entries = [d if isinstance(d, int) else 0 if i < len(src) and src[i] == d else -1 for i, d in enumerate(out)]
        if entries.count(-1) <= 1:
            return self.const(np.asarray(entries, np.int64))
        pieces = []
        for d, size in zip(out, sizes):
            if isinstance(d, int):
                pieces.append(self.const(np.asarray([d], np.int64)))
            elif d in src:
                pieces.append(self.add("Shape", [x], start=src.index(d), end=src.index(d) + 1))
            else:
                pieces.append(self.add("Unsqueeze", [self.size(size), self.const(np.asarray([0], np.int64))]))
        return self.add("Concat", pieces, axis=0)

    def shape_value(self, sizes: Sequence) -> Value:
        """A shape (ints, and sizes known only at run time: FX nodes or ``SymInt``s) as a 1-D int64
        value: a constant when every size is static, else a Concat computed when the model runs."""
        static = [d if isinstance(d, int) else size_of(d) if isinstance(d, torch.SymInt) else None for d in sizes]
        if all(isinstance(d, int) for d in static):
            return self.const(np.asarray(static, np.int64))
        zero = self.const(np.asarray([0], np.int64))
        return self.add("Concat", [self.const(np.asarray([d], np.int64)) if isinstance(d, int)
                                   else self.add("Unsqueeze", [self.size(size), zero])
                                   for d, size in zip(static, sizes)], axis=0)

    def size(self, arg) -> Value:
        """A size as a 0-d int64 value: a number as a constant; a size known only at run time (an FX
        node whose result is a ``SymInt``) computed, when the model runs, from the shape of a graph
        input that has its symbols."""
        val = arg.meta.get("val", self.symints.get(arg)) if isinstance(arg, torch.fx.Node) else arg
        if isinstance(val, bool) or not isinstance(val, (int, torch.SymInt)):
            raise Unsupported(f"{arg} is not a size")
        if isinstance(val, int) or not isinstance(size_of(val), str):
            return self.const(np.asarray(size_of(val), np.int64))
        node = val.node
        return self._size_expr(node.shape_env.simplify(node.expr) if node.shape_env is not None else node.expr)

    def _size_expr(self, expr) -> Value:
        key = str(expr)  # (one value per size: reads of it share it)
        if key not in self.sizes:
            self.sizes[key] = self._new_size(expr)
        return self.sizes[key]

    def _new_size(self, expr) -> Value:
        from torch.utils._sympy.functions import FloorDiv

        if expr.is_Integer:
            return self.const(np.asarray(int(expr), np.int64))
        if expr.is_Symbol:
            name = str(expr)
            for v in self.graph.inputs:
                if isinstance(v.type, TensorType) and name in v.shape:
                    axis = list(v.shape).index(name)
                    return self.add("Squeeze", [self.add("Shape", [v], start=axis, end=axis + 1),
                                                self.const(np.asarray([0], np.int64))])
            raise Unsupported(f"size {name}: no input of the partition has it")
        if expr.is_Add or expr.is_Mul:
            terms = [self._size_expr(a) for a in expr.args]
            acc = terms[0]
            for t in terms[1:]:
                acc = self.add("Add" if expr.is_Add else "Mul", [acc, t])
            return acc
        if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) > 0:
            base = self._size_expr(expr.base)
            acc = base
            for _ in range(int(expr.exp) - 1):
                acc = self.add("Mul", [acc, base])
            return acc
        if isinstance(expr, FloorDiv):
            return self.add("Div", [self._size_expr(expr.args[0]), self._size_expr(expr.args[1])])
        raise Unsupported(f"size {expr}: an expression Kiln does not compute")

    def kiln_dtype(self, dt):
        if dt not in DTYPES:
            raise Unsupported(f"dtype {dt}")
        return DTYPES[dt]

    def const(self, array) -> Value:
        return self.graph.add_constant(np.asarray(array))

    def value(self, arg) -> Value:
        """The Kiln value of an FX node's result (numbers: ``typed``, in the type the op computes in)."""
        if isinstance(arg, torch.fx.Node):
            v = self.values[arg]
            if v is SIZE:  # a size read as a number: a 0-d int64 value
                return self.size(arg)
            if not isinstance(v, Value):
                raise Unsupported(f"{arg.name} has several results")
            return v
        raise Unsupported(f"argument {arg!r} of type {type(arg).__name__}")

    def result_dtype(self, node) -> torch.dtype:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise Unsupported(f"no result type for {node.name}")
        return val.dtype

    def promoted(self, *args) -> torch.dtype:
        """The dtype PyTorch computes ``args`` (tensors' FX nodes and Python numbers) in."""
        tensors = [a.meta["val"] for a in args if isinstance(a, torch.fx.Node)]
        scalars = [a for a in args if isinstance(a, (bool, int, float))]
        dt = tensors[0].dtype
        for x in tensors[1:]:
            dt = torch.promote_types(dt, x.dtype)
        for x in scalars:
            if isinstance(x, float) and not (dt.is_floating_point or dt.is_complex):
                dt = torch.get_default_dtype()
            elif isinstance(x, int) and not isinstance(x, bool) and dt == torch.bool:
                dt = torch.int64
        return dt

    def typed(self, arg, dt: torch.dtype) -> Value:
        """``arg`` as a value of ``dt``: a tensor cast where its type differs, a number a constant of it."""
        kdt = self.kiln_dtype(dt)
        if isinstance(arg, torch.fx.Node):
            v = self.value(arg)
            return v if v.type.dtype is kdt else self.add("Cast", [v], to=kdt)
        if isinstance(arg, (bool, int, float)):
            return self.const(np.asarray(arg, dtype=kdt.np))
        raise Unsupported(f"argument {arg!r} of type {type(arg).__name__}")

    def add(self, name: str, inputs: Sequence[Value | None], **attrs) -> Value:
        return self.graph.add_node(op(name, **attrs), list(inputs)).output

    def add_multi(self, name: str, inputs, count: int, **attrs):
        return self.graph.add_node(op(name, **attrs), list(inputs), num_outputs=count).outputs


def import_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], constants: Mapping[int, torch.Tensor] = (),
              name: str = "torch") -> tuple[Graph, list[int]]:
    """(the Kiln graph, the positions of the placeholders it takes as inputs, in order)."""
    constants = dict(constants or {})
    g = Graph(name)
    low = Lowerer(g)
    taken: list[int] = []
    pos = 0
    # the placeholders first (a partition's may come between its nodes): every input is known before
    # a lowering reads a size off one
    nodes = sorted(gm.graph.nodes, key=lambda n: n.op != "placeholder")
    for node in nodes:
        if node.op == "placeholder":
            ex = example_inputs[pos]
            if isinstance(ex, torch.SymInt):  # a size: the tensors' shapes carry it
                low.values[node], low.symints[node] = SIZE, ex
                pos += 1
                continue
            if not isinstance(ex, torch.Tensor):
                raise ModelError(f"input {node.name} is a {type(ex).__name__}, not a tensor")
            if ex.dtype not in DTYPES:
                raise ModelError(f"input {node.name} is {ex.dtype}, which Kiln's IR does not hold")
            if pos in constants:
                low.values[node] = g.add_constant(constants[pos].detach().cpu().numpy().copy(), name=node.name)
            else:
                low.values[node] = g.add_input(node.name, TensorType(DTYPES[ex.dtype], sizes_of(ex)))
                taken.append(pos)
            pos += 1
        elif node.op == "call_function":
            if node.target is operator.getitem:
                src = low.values[node.args[0]]
                low.values[node] = src[node.args[1]]
                continue
            why = supported(node)
            if why:
                raise Unsupported(why)
            try:
                got = LOWERINGS[node.target](low, node)
            except Unsupported as e:
                raise Unsupported(f"{node.name} ({node.target}): {e}") from None
            low.values[node] = got
        elif node.op == "output":
            outs = node.args[0]
            outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            vals = [low.value(o) for o in outs]
            g.set_outputs(vals, [f"output{i}" for i in range(len(vals))])
        elif node.op == "get_attr":
            attr = getattr(gm, node.target)
            low.values[node] = g.add_constant(attr.detach().cpu().numpy().copy(), name=node.name)
        else:
            raise Unsupported(f"FX node kind {node.op} ({node.target})")
    return g, taken


__all__ = ["Lowerer", "import_fx", "size_of", "sizes_of", "supported"]
