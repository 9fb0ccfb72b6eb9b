"""One lowering per ATen op: ``LOWERINGS[aten overload] = fn(ctx, node) -> Value | list[Value]``.

``ctx`` (``importer.Lowerer``) turns the FX node's arguments into Kiln values (``ctx.value``: an FX
node's result, or a Python number as a constant of the right type), adds nodes (``ctx.add``) and
constants (``ctx.const``). A lowering that cannot take a node's arguments raises ``Unsupported``
with the reason; the partitioner asks ``supported(node)`` first, so such nodes run in PyTorch.

The ops are core ATen (after ``torch._decomp.core_aten_decompositions``), plus the few that
PyTorch keeps whole and Kiln has as one op (``gelu``, ``native_layer_norm``, ``_softmax``).
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from compiler.ir import ops
from compiler.ir.types import DType

aten = torch.ops.aten


class Unsupported(Exception):
    """This node has no Kiln lowering (the message says why)."""


#: what a size known only at run time lowers to (a ``SymInt`` placeholder, ``sym_size``, arithmetic
#: on sizes): nothing. Lowerings read sizes from shapes (``importer.Lowerer.meta_shape``).
SIZE = type("Size", (), {"__repr__": lambda self: "SIZE"})()


def op(name: str, **attrs):
    return ops.lookup(name)(**attrs)


def _ints(v, n=None):
    v = [_int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
    return v * n if n and len(v) == 1 else v


def _int(x) -> int:
    """An int argument; one known only at run time (an FX node: a size) is refused."""
    if isinstance(x, (torch.fx.Node, torch.SymInt)):
        raise Unsupported(f"argument {x} is known only at run time")
    return int(x)


def _rank(ctx, node_arg) -> int:
    return len(ctx.meta_shape(node_arg))


def _axis(ctx, x, dim: int) -> int:
    return dim % max(_rank(ctx, x), 1)


def _binary(name, compare=False):
    """Arithmetic in the result's type, comparisons in the operands' promoted type (as PyTorch):
    operands of another type are cast first, numbers become constants of it."""
    def lower(ctx, n):
        a, b = n.args[:2]
        alpha = n.kwargs.get("alpha", n.args[2] if len(n.args) > 2 else 1)
        dt = ctx.promoted(a, b) if compare else ctx.result_dtype(n)
        va, vb = ctx.typed(a, dt), ctx.typed(b, dt)
        if alpha != 1:
            vb = ctx.add("Mul", [vb, ctx.typed(alpha, dt)])
        return ctx.add(name, [va, vb])
    return lower


def _unary(name, **attrs):
    return lambda ctx, n: ctx.add(name, [ctx.value(n.args[0])], **attrs)


def _convolution(ctx, n):
    x, w, b, stride, padding, dilation, transposed, out_pad, groups = n.args
    nd = len(ctx.meta_shape(w)) - 2
    pads = _ints(padding, nd)
    ins = [ctx.value(x), ctx.value(w)] + ([ctx.value(b)] if b is not None else [])
    if transposed:  # the weight is [C_in, C_out / groups, k...] in both PyTorch and ONNX
        return ctx.add("ConvTranspose", ins, strides=tuple(_ints(stride, nd)), dilations=tuple(_ints(dilation, nd)),
                       pads=tuple(pads + pads), output_padding=tuple(_ints(out_pad, nd)), group=int(groups),
                       kernel_shape=tuple(ctx.meta_shape(w)[2:]))
    return ctx.add("Conv", ins, strides=tuple(_ints(stride, nd)), dilations=tuple(_ints(dilation, nd)),
                   pads=tuple(pads + pads), group=int(groups), kernel_shape=tuple(ctx.meta_shape(w)[2:]))


def _batch_norm(ctx, n):
    x, w, b, mean, var, _momentum, eps = n.args
    return _batch_norm_of(ctx, x, w, b, mean, var, eps)


def _batch_norm_of(ctx, x, w, b, mean, var, eps):
    if mean is None or var is None:
        raise Unsupported("batch norm without running statistics")
    c = ctx.static_dim(x, 1) if w is None or b is None else None
    scale = ctx.value(w) if w is not None else ctx.const(np.ones(c, np.float32))
    bias = ctx.value(b) if b is not None else ctx.const(np.zeros(c, np.float32))
    y = ctx.add_multi("BatchNormalization", [ctx.value(x), scale, bias, ctx.value(mean), ctx.value(var)], 1,
                      epsilon=float(eps))[0]
    return [y, None, None]


def _native_batch_norm(ctx, n):
    x, w, b, mean, var, training, _momentum, eps = n.args
    if training:
        raise Unsupported("batch norm in training mode")
    return _batch_norm_of(ctx, x, w, b, mean, var, eps)


def _max_pool(ctx, n):
    args = list(n.args) + [None] * (6 - len(n.args))
    x, k, stride, padding, dilation, ceil = args[:6]
    nd = len(_ints(k))
    stride = _ints(stride, nd) if stride else _ints(k, nd)
    pads = _ints(padding or 0, nd)
    y = ctx.add_multi("MaxPool", [ctx.value(x)], 1, kernel_shape=tuple(_ints(k, nd)), strides=tuple(stride),
                      pads=tuple(pads + pads), dilations=tuple(_ints(dilation or 1, nd)),
                      ceil_mode=int(bool(ceil)))[0]
    return [y, None]


def _avg_pool(ctx, n):
    args = list(n.args) + [None] * (7 - len(n.args))
    x, k, stride, padding, ceil, include_pad, divisor = args[:7]
    if divisor is not None:
        raise Unsupported("avg_pool with divisor_override")
    nd = len(_ints(k))
    pads = _ints(padding or 0, nd)
    return ctx.add("AveragePool", [ctx.value(x)], kernel_shape=tuple(_ints(k, nd)),
                   strides=tuple(_ints(stride, nd) if stride else _ints(k, nd)), pads=tuple(pads + pads),
                   ceil_mode=int(bool(ceil)), count_include_pad=int(True if include_pad is None else include_pad))


def _adaptive_avg_pool(ctx, n):
    x, size = n.args
    if any(int(s) != 1 for s in _ints(size)):
        raise Unsupported("adaptive average pooling to a size other than 1")
    return ctx.add("GlobalAveragePool", [ctx.value(x)])


def _view(ctx, n):
    x = ctx.value(n.args[0])
    return ctx.add("Reshape", [x, ctx.reshape_operand(x, ctx.meta_shape(n.args[0]), n)])


def _permute(ctx, n):
    x, perm = n.args
    r = _rank(ctx, x)
    return ctx.add("Transpose", [ctx.value(x)], perm=tuple(int(p) % r for p in perm))


def _bitwise(logical, bitwise):
    """On bool tensors (``a & b`` of comparisons) the logical op, else the bitwise one."""
    def lower(ctx, n):
        dt = ctx.promoted(*n.args[:2])
        return ctx.add(logical if dt == torch.bool else bitwise, [ctx.typed(n.args[0], dt), ctx.typed(n.args[1], dt)])
    return lower


def _t(ctx, n):
    x = n.args[0]
    if _rank(ctx, x) < 2:
        return ctx.value(x)
    return ctx.add("Transpose", [ctx.value(x)], perm=(1, 0))


def _addmm(ctx, n):
    bias, a, b = n.args[:3]
    beta, alpha = float(n.kwargs.get("beta", 1)), float(n.kwargs.get("alpha", 1))
    return ctx.add("Gemm", [ctx.value(a), ctx.value(b), ctx.value(bias)], alpha=alpha, beta=beta)


def _matmul(ctx, n):
    if n.target == aten.bmm.default:
        xa, xb = _unfolded(ctx, n.args[0]), _unfolded(ctx, n.args[1])
        if xa is not None and xb is not None and ctx.meta_shape(xa)[:-2] == ctx.meta_shape(xb)[:-2]:
            # matmul's decomposition folds the batch dims for bmm; multiplied unfolded, attention
            # reads as it does from ONNX (and fuses into one kernel), the result folded as before
            y = ctx.add("MatMul", [ctx.value(xa), ctx.value(xb)])
            sizes = ctx.meta_shape(xa)[:-1] + ctx.meta_shape(xb)[-1:]
            return ctx.add("Reshape", [y, ctx.reshape_operand(y, sizes, n)])
    return ctx.add("MatMul", [ctx.value(n.args[0]), ctx.value(n.args[1])])


#: the ATen views that reshape
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)


def _unfolded(ctx, arg):
    """``x`` when ``arg`` (an FX node) is a reshape of ``x`` that folds leading dims of ``x`` (rank 4
    or more) into one and keeps the last two, else None. (A reshape keeps the number of elements:
    with the last two sizes the same, the first is the product of the others, whether the sizes are
    static or known only at run time.)"""
    if not isinstance(arg, torch.fx.Node) or arg.target not in _RESHAPES:
        return None
    x = arg.args[0]
    xs, vs = ctx.meta_shape(x), ctx.meta_shape(arg)
    if len(xs) < 4 or len(vs) != 3 or xs[-2:] != vs[-2:]:
        return None
    return x


def _layer_norm(ctx, n):
    x, shape, w, b, eps = n.args
    r = _rank(ctx, x)
    k = len(_ints(shape))
    scale = ctx.value(w) if w is not None else ctx.const(np.ones([ctx.static_dim(x, a) for a in range(r - k, r)],
                                                                 np.float32))
    ins = [ctx.value(x), scale] + ([ctx.value(b)] if b is not None else [])
    return [ctx.add_multi("LayerNormalization", ins, 1, axis=r - k, epsilon=float(eps))[0], None, None]


def _softmax(name):
    def lower(ctx, n):
        x, dim = n.args[:2]
        return ctx.add(name, [ctx.value(x)], axis=_axis(ctx, x, int(dim)))
    return lower


def _gelu(ctx, n):
    approx = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
    return ctx.add("Gelu", [ctx.value(n.args[0])], approximate=str(approx))


def _reduce(name):
    def lower(ctx, n):
        args = list(n.args) + [None] * (3 - len(n.args))
        x, dims, keep = args[:3]
        keep = n.kwargs.get("keepdim", keep)
        if n.kwargs.get("dtype") is not None:
            raise Unsupported("a reduction with a dtype conversion")
        r = _rank(ctx, x)
        dims = list(range(r)) if dims is None or dims == [] else [int(d) % r for d in _ints(dims)]
        return ctx.add(name, [ctx.value(x), ctx.const(np.asarray(dims, np.int64))], keepdims=int(bool(keep)))
    return lower


def _pow(ctx, n):
    x, e = n.args
    dt = ctx.result_dtype(n)
    return ctx.add("Pow", [ctx.typed(x, dt), ctx.typed(e, dt)])


def _rsqrt(ctx, n):
    x = ctx.value(n.args[0])
    return ctx.add("Reciprocal", [ctx.add("Sqrt", [x])])


def _clamp(ctx, n):
    args = list(n.args) + [None] * (3 - len(n.args))
    x, lo, hi = args[:3]
    dt = ctx.result_dtype(n)
    ins = [ctx.typed(x, dt), ctx.typed(lo, dt) if lo is not None else None,
           ctx.typed(hi, dt) if hi is not None else None]
    while ins[-1] is None:
        ins.pop()
    return ctx.add("Clip", ins)


def _hardtanh(ctx, n):
    x = n.args[0]
    lo = n.args[1] if len(n.args) > 1 else -1.0
    hi = n.args[2] if len(n.args) > 2 else 1.0
    dt = ctx.result_dtype(n)
    return ctx.add("Clip", [ctx.typed(x, dt), ctx.typed(lo, dt), ctx.typed(hi, dt)])


def _expand(ctx, n):
    shape, src = ctx.meta_shape(n), ctx.meta_shape(n.args[0])
    x = ctx.value(n.args[0])
    if src == shape:  # (matmul's decomposition expands its operands to their own shapes: an Expand
        return x      # there hid attention from fusion)
    lead = len(shape) - len(src)
    sizes = list(n.meta["val"].shape)
    for i, d in enumerate(shape):  # a size known only at run time: the input's (1 keeps it), or new
        if not isinstance(d, int):  # (computed when the model runs)
            shape[i] = 1 if i >= lead and src[i - lead] == d else sizes[i]
    return ctx.add("Expand", [x, ctx.shape_value(shape)])


def _unsqueeze(ctx, n):
    x, d = n.args
    return ctx.add("Unsqueeze", [ctx.value(x), ctx.const(np.asarray([_int(d) % (_rank(ctx, x) + 1)], np.int64))])


def _squeeze(ctx, n):
    x = n.args[0]
    r = _rank(ctx, x)
    shape = ctx.meta_shape(x)
    dims = _ints(n.args[1]) if len(n.args) > 1 else [i for i in range(r) if shape[i] == 1]
    dims = [d % r for d in dims if shape[d % r] == 1]
    if not dims:
        return ctx.value(x)
    return ctx.add("Squeeze", [ctx.value(x), ctx.const(np.asarray(dims, np.int64))])


def _cat(ctx, n):
    xs = [x for x in n.args[0] if 0 not in ctx.meta_shape(x)]
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
    return ctx.add("Concat", [ctx.value(x) for x in xs], axis=_axis(ctx, n, int(dim)))


def _slice(ctx, n):
    args = list(n.args) + [None] * (5 - len(n.args))
    x, dim, start, end, step = args[:5]
    dim = _axis(ctx, x, _int(dim or 0))
    size = ctx.meta_shape(x)[dim]
    size = size if isinstance(size, int) else _END  # (Slice clamps the end to the size)

    def bound(b, default):  # a 1-D operand (a size known only at run time: computed then)
        if isinstance(b, torch.fx.Node):
            return ctx.add("Unsqueeze", [ctx.size(b), ctx.const(np.asarray([0], np.int64))])
        return ctx.const(np.asarray([default if b is None else min(_int(b), size)], np.int64))

    return ctx.add("Slice", [ctx.value(x), bound(start, 0), bound(end, size), ctx.const(np.asarray([dim], np.int64)),
                             ctx.const(np.asarray([_int(step or 1)], np.int64))])


#: a slice's end past any size
_END = 2 ** 62


def _select(ctx, n):
    x, dim, index = n.args
    dim = _axis(ctx, x, _int(dim))
    return ctx.add("Gather", [ctx.value(x), ctx.const(np.asarray(_int(index), np.int64))], axis=dim)


def _embedding(ctx, n):
    w, idx = n.args[:2]
    return ctx.add("Gather", [ctx.value(w), ctx.value(idx)], axis=0)


def _pad(ctx, n):
    x, pad = n.args[:2]
    value = n.args[2] if len(n.args) > 2 else 0.0
    r = _rank(ctx, x)
    pad = _ints(pad)
    begins, ends = [0] * r, [0] * r
    for i in range(len(pad) // 2):  # torch: last axis first, (begin, end) pairs
        begins[r - 1 - i], ends[r - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if any(p < 0 for p in begins + ends):
        raise Unsupported("negative padding")
    if not any(begins + ends):
        return ctx.value(x)
    return ctx.add("Pad", [ctx.value(x), ctx.const(np.asarray(begins + ends, np.int64)),
                           ctx.typed(value, ctx.result_dtype(n))], mode="constant")


def _where(ctx, n):
    c, a, b = n.args
    dt = ctx.result_dtype(n)
    return ctx.add("Where", [ctx.typed(c, torch.bool), ctx.typed(a, dt), ctx.typed(b, dt)])


def _to_copy(ctx, n):
    dt = n.kwargs.get("dtype")
    x = ctx.value(n.args[0])
    if dt is None:
        return x
    return ctx.add("Cast", [x], to=ctx.kiln_dtype(dt))


def _copy(ctx, n):
    """``copy(self, src)``, what functionalization makes of ``self.copy_(src)``: ``src`` in ``self``'s
    type and shape."""
    dst, src = n.args[:2]
    v = ctx.typed(src, ctx.result_dtype(n))
    if ctx.meta_shape(src) != ctx.meta_shape(dst):
        v = ctx.add("Expand", [v, ctx.add("Shape", [ctx.value(dst)])])
    return v


def _identity(ctx, n):
    return ctx.value(n.args[0])


def _split(ctx, n):
    x, sizes = n.args[:2]
    dim = _axis(ctx, x, int(n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)))
    total = ctx.static_dim(x, dim)
    if isinstance(sizes, int):  # split.Tensor: chunks of ``sizes``
        sizes = [sizes] * (total // sizes) + ([total % sizes] if total % sizes else [])
    return list(ctx.add_multi("Split", [ctx.value(x), ctx.const(np.asarray(_ints(sizes), np.int64))],
                              len(sizes), axis=dim))


def _const_of(ctx, n, array):
    """A node whose value is known when compiling (from its static arguments): a constant."""
    dt = n.kwargs.get("dtype")
    val = n.meta.get("val")
    np_dt = DTYPES[val.dtype].np if isinstance(val, torch.Tensor) and val.dtype in DTYPES else None
    if dt is not None:
        np_dt = DTYPES[dt].np
    return ctx.const(np.asarray(array, dtype=np_dt))


def _arange(ctx, n):
    args = [a for a in n.args]
    start, end = (args[0], args[1]) if len(args) > 1 else (0, args[0])
    step = args[2] if len(args) > 2 else n.kwargs.get("step", 1)
    if not any(isinstance(a, torch.fx.Node) for a in (start, end, step)):
        return _const_of(ctx, n, np.arange(start, end, step))
    # bounds known only at run time (sizes): a Range computed then
    dt = ctx.kiln_dtype(ctx.result_dtype(n))
    bounds = [(ctx.size(a) if dt is DType.i64 else ctx.add("Cast", [ctx.size(a)], to=dt))
              if isinstance(a, torch.fx.Node) else ctx.const(np.asarray(a, dt.np)) for a in (start, end, step)]
    return ctx.add("Range", bounds)


def _full(ctx, n):
    shape, value = n.args[:2]
    if not any(isinstance(d, torch.fx.Node) for d in shape):
        return _const_of(ctx, n, np.full(_ints(shape), value))
    # sizes known only at run time: the value expanded to them then
    return ctx.add("Expand", [_const_of(ctx, n, np.asarray(value)), ctx.shape_value(shape)])


def _full_like(ctx, n):
    shape = ctx.meta_shape(n.args[0])
    if all(isinstance(d, int) for d in shape):
        return _const_of(ctx, n, np.full(shape, n.args[1]))
    # sizes known only at run time: the value expanded to the input's shape then
    return ctx.add("Expand", [_const_of(ctx, n, np.asarray(n.args[1])), ctx.add("Shape", [ctx.value(n.args[0])])])


def _scalar_tensor(ctx, n):
    return _const_of(ctx, n, np.asarray(n.args[0]))


def _index_select(ctx, n):
    x, dim, idx = n.args
    return ctx.add("Gather", [ctx.value(x), ctx.value(idx)], axis=_axis(ctx, x, int(dim)))


def _fmod(ctx, n):
    a, b = n.args
    dt = ctx.result_dtype(n)
    return ctx.add("Mod", [ctx.typed(a, dt), ctx.typed(b, dt)], fmod=1)


def _any(ctx, n):
    x = ctx.value(n.args[0])
    if x.type.dtype is not DType.bool:
        x = ctx.add("Cast", [x], to=DType.bool)
    dims = _ints(n.args[1]) if len(n.args) > 1 else list(range(_rank(ctx, n.args[0])))
    keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
    r = _rank(ctx, n.args[0])
    return ctx.add("ReduceMax", [x, ctx.const(np.asarray([d % r for d in dims], np.int64))], keepdims=int(bool(keep)))


def _vector_norm(ctx, n):
    args = list(n.args) + [None] * (4 - len(n.args))
    x, ord_, dims, keep = args[:4]
    ord_ = n.kwargs.get("ord", 2 if ord_ is None else ord_)
    keep = n.kwargs.get("keepdim", keep)
    if float(ord_) not in (1.0, 2.0) or n.kwargs.get("dtype") is not None:
        raise Unsupported(f"vector norm of order {ord_}")
    r = _rank(ctx, x)
    dims = list(range(r)) if dims is None else [int(d) % r for d in _ints(dims)]
    return ctx.add("ReduceL2" if float(ord_) == 2.0 else "ReduceL1",
                   [ctx.value(x), ctx.const(np.asarray(dims, np.int64))], keepdims=int(bool(keep)))


def _group_norm(ctx, n):
    x, w, b, _n, c, _hw, groups, eps = n.args
    scale = ctx.value(w) if w is not None else ctx.const(np.ones(int(c), np.float32))
    bias = ctx.value(b) if b is not None else ctx.const(np.zeros(int(c), np.float32))
    y = ctx.add("GroupNormalization", [ctx.value(x), scale, bias], num_groups=int(groups), epsilon=float(eps))
    return [y, None, None]


def _upsample(mode):
    """``upsample_*2d`` (sizes and scales as separate arguments) and their ``.vec`` forms (a list of
    scales), as Resize to the result's sizes; batch and channels may be known only at run time (then
    read off the input's shape), the spatial sizes may not."""
    def lower(ctx, n):
        x = n.args[0]
        align = bool(n.args[2]) if mode == "linear" and len(n.args) > 2 else False
        scales = []
        for a in n.args[3 if mode == "linear" else 2:]:
            scales += a if isinstance(a, (list, tuple)) else [] if a is None else [a]
        ins, outs = ctx.meta_shape(x), ctx.meta_shape(n)
        ins_hw = [ctx.static_dim(x, a) for a in range(2, len(ins))]
        outs_hw = [ctx.static_dim(n, a) for a in range(2, len(outs))]
        if scales and any(abs(float(sc) - o / i) > 1e-9 for sc, o, i in zip(scales, outs_hw, ins_hw)):
            raise Unsupported("upsampling whose scale factors are not the size ratios")
        ctm = "align_corners" if align else "pytorch_half_pixel" if mode == "linear" else "asymmetric"
        if all(isinstance(d, int) for d in outs):
            sizes = ctx.const(np.asarray(outs, np.int64))
        else:
            sizes = ctx.add("Concat", [ctx.add("Shape", [ctx.value(x)], start=0, end=2),
                                       ctx.const(np.asarray(outs_hw, np.int64))], axis=0)
        return ctx.add("Resize", [ctx.value(x), None, None, sizes], mode=mode, coordinate_transformation_mode=ctm,
                       nearest_mode="floor")
    return lower


def _index(ctx, n):
    x, indices = n.args
    tensors = [(axis, i) for axis, i in enumerate(indices) if i is not None]
    if len(tensors) != 1:
        raise Unsupported("advanced indexing with more than one index tensor")
    axis, idx = tensors[0]
    return ctx.add("Gather", [ctx.value(x), ctx.value(idx)], axis=axis)


def _size(ctx, n):
    return SIZE


def _check(ctx, n):
    return None


LOWERINGS = {
    aten.convolution.default: _convolution,
    aten._native_batch_norm_legit_no_training.default: _batch_norm,
    aten.native_batch_norm.default: _native_batch_norm,
    aten.max_pool2d_with_indices.default: _max_pool,
    aten.avg_pool2d.default: _avg_pool,
    aten._adaptive_avg_pool2d.default: _adaptive_avg_pool,
    aten.view.default: _view, aten._unsafe_view.default: _view, aten.reshape.default: _view,
    aten.permute.default: _permute, aten.t.default: _t,
    aten.addmm.default: _addmm, aten.mm.default: _matmul, aten.bmm.default: _matmul, aten.matmul.default: _matmul,
    aten.native_layer_norm.default: _layer_norm,
    aten._softmax.default: _softmax("Softmax"), aten._log_softmax.default: _softmax("LogSoftmax"),
    aten.gelu.default: _gelu,
    aten.add.Tensor: _binary("Add"), aten.sub.Tensor: _binary("Sub"), aten.mul.Tensor: _binary("Mul"),
    aten.div.Tensor: _binary("Div"), aten.maximum.default: _binary("Max"), aten.minimum.default: _binary("Min"),
    aten.eq.Tensor: _binary("Equal", compare=True), aten.eq.Scalar: _binary("Equal", compare=True), aten.lt.Tensor: _binary("Less", compare=True),
    aten.lt.Scalar: _binary("Less", compare=True), aten.gt.Tensor: _binary("Greater", compare=True), aten.gt.Scalar: _binary("Greater", compare=True),
    aten.add.Scalar: _binary("Add"), aten.mul.Scalar: _binary("Mul"), aten.sub.Scalar: _binary("Sub"),
    aten.div.Scalar: _binary("Div"),
    aten.relu.default: _unary("Relu"), aten.sigmoid.default: _unary("Sigmoid"), aten.tanh.default: _unary("Tanh"),
    aten.exp.default: _unary("Exp"), aten.log.default: _unary("Log"), aten.sqrt.default: _unary("Sqrt"),
    aten.neg.default: _unary("Neg"), aten.abs.default: _unary("Abs"), aten.erf.default: _unary("Erf"),
    aten.reciprocal.default: _unary("Reciprocal"), aten.rsqrt.default: _rsqrt, aten.sin.default: _unary("Sin"),
    aten.cos.default: _unary("Cos"), aten.logical_not.default: _unary("Not"),
    aten.pow.Tensor_Scalar: _pow, aten.pow.Tensor_Tensor: _pow,
    aten.mean.dim: _reduce("ReduceMean"), aten.sum.dim_IntList: _reduce("ReduceSum"),
    aten.amax.default: _reduce("ReduceMax"), aten.amin.default: _reduce("ReduceMin"),
    aten.clamp.default: _clamp, aten.hardtanh.default: _hardtanh,
    aten.expand.default: _expand, aten.unsqueeze.default: _unsqueeze,
    aten.squeeze.dims: _squeeze, aten.squeeze.default: _squeeze,
    aten.cat.default: _cat, aten.slice.Tensor: _slice, aten.select.int: _select,
    aten.embedding.default: _embedding, aten.constant_pad_nd.default: _pad, aten.where.self: _where,
    aten._to_copy.default: _to_copy, aten.clone.default: _identity, aten.alias.default: _identity,
    aten.detach.default: _identity, aten.lift_fresh_copy.default: _identity, aten.copy.default: _copy,
    aten.split_with_sizes.default: _split, aten.split.Tensor: _split,
    aten.arange.start_step: _arange, aten.arange.default: _arange, aten.arange.start: _arange,
    aten.full.default: _full, aten.full_like.default: _full_like, aten.scalar_tensor.default: _scalar_tensor,
    aten.ge.Scalar: _binary("GreaterOrEqual", compare=True), aten.ge.Tensor: _binary("GreaterOrEqual", compare=True),
    aten.le.Scalar: _binary("LessOrEqual", compare=True), aten.le.Tensor: _binary("LessOrEqual", compare=True),
    aten.ne.Scalar: lambda ctx, n: ctx.add("Not", [_binary("Equal", compare=True)(ctx, n)]),
    aten.ne.Tensor: lambda ctx, n: ctx.add("Not", [_binary("Equal", compare=True)(ctx, n)]),
    aten.index_select.default: _index_select, aten.fmod.Scalar: _fmod, aten.fmod.Tensor: _fmod,
    aten.any.dim: _any, aten.any.dims: _any, aten.linalg_vector_norm.default: _vector_norm,
    aten.logical_and.default: _binary("And", compare=True), aten.logical_or.default: _binary("Or", compare=True),
    aten.bitwise_and.Tensor: _bitwise("And", "BitwiseAnd"), aten.bitwise_or.Tensor: _bitwise("Or", "BitwiseOr"),
    aten.bitwise_xor.Tensor: _bitwise("Xor", "BitwiseXor"), aten.bitwise_and.Scalar: _bitwise("And", "BitwiseAnd"),
    aten.bitwise_or.Scalar: _bitwise("Or", "BitwiseOr"), aten.bitwise_xor.Scalar: _bitwise("Xor", "BitwiseXor"),
    aten.bitwise_not.default: lambda ctx, n: ctx.add("Not" if ctx.result_dtype(n) == torch.bool else "BitwiseNot",
                                                     [ctx.value(n.args[0])]),
    aten.native_group_norm.default: _group_norm, aten.upsample_bilinear2d.default: _upsample("linear"),
    aten.upsample_nearest2d.default: _upsample("nearest"), aten.index.Tensor: _index,
    aten.upsample_bilinear2d.vec: _upsample("linear"), aten.upsample_nearest2d.vec: _upsample("nearest"),
    # sizes known only at run time (dynamic shapes): nothing to lower (``SIZE``)
    aten.sym_size.int: _size, operator.mul: _size, operator.add: _size, operator.sub: _size,
    operator.floordiv: _size,
    # checks torch.export puts in a program with dynamic shapes (of dtypes, of sizes): no value
    aten._assert_tensor_metadata.default: _check, aten._assert_scalar.default: _check,
    aten.sym_constrain_range_for_size.default: _check,
    # the copying forms of views (what functionalization may leave): the same values
    aten.view_copy.default: _view, aten.permute_copy.default: _permute, aten.slice_copy.Tensor: _slice,
    aten.select_copy.int: _select, aten.split_copy.Tensor: _split, aten.t_copy.default: _t,
    aten.unsqueeze_copy.default: _unsqueeze, aten.expand_copy.default: _expand,
    aten.split_with_sizes_copy.default: _split, aten.squeeze_copy.dims: _squeeze,
}

#: PyTorch dtypes Kiln's IR holds
DTYPES = {torch.float32: DType.f32, torch.float64: DType.f64, torch.float16: DType.f16, torch.bfloat16: DType.bf16,
          torch.int64: DType.i64, torch.int32: DType.i32, torch.int16: DType.i16, torch.int8: DType.i8,
          torch.uint8: DType.u8, torch.bool: DType.bool}

# nn.LSTM / GRU / RNN, kept whole as ``kiln::`` ops (``recurrent.py``; it uses ``Unsupported`` above)
from .recurrent import LOWERINGS as _RECURRENT  # noqa: E402

LOWERINGS.update(_RECURRENT)
