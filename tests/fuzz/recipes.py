"""The generator's recipes: each adds one op, or a short chain shaped to meet one of Kiln's fusion rules
(docs/fusion.md), to a ``Builder``, and returns a short tag for the case's description; ``Skip`` (or a
shape-inference failure) rolls it back. ``RECIPES`` maps each to its weight."""
from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from .builder import BOOL, F32, I64, MAX_ELEMENTS, Builder, Skip


def r_unary(b: Builder) -> str:
    x = b.pick()
    v = b.v(x)
    ops = ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Erf", "Softsign", "Identity", "HardSwish", "LeakyRelu",
           "Elu", "HardSigmoid", "Selu", "Celu", "Clip", "SqrtAbs", "LogAbs", "Recip", "Gelu", "Swish"]
    if v.scale < 8:
        ops += ["Exp", "Softplus", "Sin", "Cos"]
    if v.exact:
        ops += ["Floor", "Ceil", "Round", "Sign"]
    op = b.choice(ops)
    exact = op in ("Neg", "Abs", "Identity", "Relu", "Floor", "Ceil", "Round", "Sign") and v.exact
    if op in ("LeakyRelu", "Elu", "Celu"):
        b.node(op, [x], alpha=float(b.choice([0.01, 0.1, 0.5, 1.0, 2.0])))
    elif op == "HardSigmoid":
        b.node(op, [x], alpha=float(b.choice([0.2, 0.5])), beta=float(b.choice([0.5, 0.3])))
    elif op == "Clip":
        lo = float(b.choice([0.0, -1.0, -0.5]))
        b.node(op, [x, b.scalar(lo), b.scalar(lo + float(b.choice([0.5, 1.0, 6.0])))], scale=6.0)
    elif op == "SqrtAbs":
        b.node("Sqrt", [b.node("Abs", [x])])
    elif op == "LogAbs":
        b.node("Log", [b.node("Add", [b.node("Abs", [x]), b.scalar(1.0)])])
    elif op == "Recip":
        b.node("Reciprocal", [b.node("Add", [b.node("Abs", [x]), b.scalar(0.5)])], scale=2.0)
    elif op == "Gelu":
        erf = b.node("Erf", [b.node("Div", [x, b.scalar(math.sqrt(2.0))])])
        b.node("Mul", [b.node("Mul", [x, b.scalar(0.5)]), b.node("Add", [erf, b.scalar(1.0)])])
    elif op == "Swish":
        b.node("Mul", [x, b.node("Sigmoid", [x])])
    elif op == "Exp":
        b.node(op, [x], scale=math.exp(v.scale))
    else:
        b.node(op, [x], exact=exact, scale=1.0 if op in ("Sigmoid", "Tanh", "Erf", "Sin", "Cos") else None)
    return op


def r_binary(b: Builder) -> str:
    x = b.pick()
    v = b.v(x)
    op = b.choice(["Add", "Sub", "Mul", "Max", "Min", "Div", "Pow", "Add", "Mul"])
    how = b.choice(["const", "input", "value", "value"])
    if op in ("Div", "Pow"):
        how = "const"
    shp = b.bcast_shape(v.shape)
    if how == "value":
        cands = [n for n in b.order if b.v(n).dtype == F32 and _broadcasts(b.v(n).shape, v.shape)]
        y = b.choice(cands) if cands else b.input(shp)
    elif how == "input":
        y = b.input(shp)
    elif op == "Div":
        vals = b.rng.uniform(0.5, 2.0, shp) * np.where(b.rng.random(shp) < 0.5, -1, 1)
        y = b.const(vals.astype(np.float32))
    elif op == "Pow":
        y = b.scalar(float(b.choice([2.0, 3.0])))
        if v.scale > 30:
            raise Skip("Pow of large values")
    else:
        y = b.const(b.rng.standard_normal(shp).astype(np.float32))
    if b.chance(0.2) and op not in ("Div", "Pow"):
        x, y = y, x
    scale = v.scale * 3 if op == "Pow" else v.scale * 2 + 3
    b.node(op, [x, y], scale=scale, exact=op in ("Max", "Min") and v.exact and y in b.feeds)
    return f"{op}({how})"


def _broadcasts(a: tuple, b_: tuple) -> bool:
    try:
        return int(np.prod(np.broadcast_shapes(a, b_))) <= MAX_ELEMENTS
    except ValueError:
        return False


def r_variadic(b: Builder) -> str:
    x = b.pick(ranks=range(1, 5))
    op = b.choice(["Sum", "Mean", "Max", "Min"])
    ins = [x] + [b.input(b.bcast_shape(b.v(x).shape)) if b.chance(0.5) else
                 b.const(b.rng.standard_normal(b.bcast_shape(b.v(x).shape)).astype(np.float32))
                 for _ in range(b.int(1, 3))]
    b.node(op, ins)
    return f"{op}x{len(ins)}"


def r_matmul(b: Builder) -> str:
    kind = b.choice(["dense", "dense", "resid", "resid", "two", "gemm", "vec"])
    if kind == "resid":  # [B,1,D] x [D,D] + bias? + residual: the epilogue must read each batch's row
        bsz, d = b.int(2, 5), b.int(1, 40)
        x = b.input((bsz, 1, d)) if b.chance(0.7) else b.input((bsz, b.int(1, 3), 1, d))
        y = b.node("MatMul", [x, b.weight((d, d))])
        if b.chance(0.35):  # (a bias makes canonicalize turn the MatMul into a Gemm between Reshapes)
            y = b.node("Add", [y, b.weight((d,), 1)])
        if b.chance(0.3):
            y = b.node(b.choice(["Relu", "Tanh", "Sigmoid"]), [y])
        b.node("Add", [y, x] if b.chance(0.7) else [x, y])
        return f"MatMul[{bsz},1,{d}]x[{d},{d}]+residual"
    if kind == "two":  # both operands computed, batch dims broadcast
        x = b.pick(ranks=range(2, 5), pred=lambda v: v.shape[-1] > 0 or b.zero)
        sx = b.v(x).shape
        batch = b.bcast_shape(sx[:-2]) if len(sx) > 2 else ()
        if b.chance(0.7):
            y = b.input(tuple(batch) + (sx[-1], b.dim()))
            b.node("MatMul", [x, y])
        else:
            y = b.input(tuple(batch) + (b.dim(), sx[-2]))
            b.node("MatMul", [y, x])
        return f"MatMul {list(sx)}x{list(b.v(y).shape)}"
    if kind == "gemm":
        x = b.pick(ranks=[2], new_prob=0.4)
        m, k = b.v(x).shape
        ta, tb = b.chance(0.25), b.chance(0.4)
        if ta:
            x = b.node("Transpose", [x], perm=[1, 0], exact=b.v(x).exact)
        n = b.dim()
        w = b.weight((n, k) if tb else (k, n), k)
        ins = [x, w]
        cshape = b.choice([(n,), (1, n), (m, n), (m, 1), (), None])
        if cshape is not None:
            ins.append(b.weight(cshape, 1))
        alpha, beta = float(b.choice([1.0, 1.0, 0.5, 2.0])), float(b.choice([1.0, 1.0, 0.25]))
        y = b.node("Gemm", ins, transA=int(ta), transB=int(tb), alpha=alpha, beta=beta)
        _epilogue(b, y)
        return f"Gemm transA={int(ta)} transB={int(tb)} C={cshape}"
    if kind == "vec":
        x = b.pick(ranks=[1, 2, 3])
        k = b.v(x).shape[-1]
        if b.chance(0.5):
            b.node("MatMul", [x, b.weight((k,), k)])
        else:
            b.node("MatMul", [b.weight((b.dim(), k), k), b.node("Unsqueeze", [x, b.ints([-1])])])
        return "MatMul vector"
    x = b.pick(ranks=range(1, 5), new_prob=0.3)
    k = b.v(x).shape[-1]
    n = k if b.chance(0.3) else b.dim()
    y = b.node("MatMul", [x, b.weight((k, n), k)])
    _epilogue(b, y, x if n == k else None)
    return f"MatMul {list(b.v(x).shape)}x[{k},{n}]"


def _epilogue(b: Builder, y: str, residual_of: str | None = None, spatial: int | None = None) -> str:
    """Bias, activation and residual add after a GEMM or convolution (what the epilogue rule fuses);
    ``spatial``: the convolution's number of spatial axes (its bias is per channel)."""
    if b.chance(0.4):  # a bias (per column, or per channel for a convolution)
        if spatial is None:
            n = _last_dim_guess(b, y)
            y = b.node("Add", [y, b.weight((n,), 1)]) if n else y
        else:
            y = b.node("Add", [y, b.weight((_channels(b, y),) + (1,) * spatial, 1)])
    if b.chance(0.6):
        act = b.choice(["Relu", "Relu", "Clip6", "LeakyRelu", "Sigmoid", "Swish", "Tanh"])
        if act == "Clip6":
            y = b.node("Clip", [y, b.scalar(0.0), b.scalar(6.0)])
        elif act == "LeakyRelu":
            y = b.node(act, [y], alpha=0.1)
        elif act == "Swish":
            y = b.node("Mul", [y, b.node("Sigmoid", [y])])
        else:
            y = b.node(act, [y])
    if b.chance(0.35) and residual_of is not None:
        y = b.node("Add", [y, residual_of] if b.chance(0.5) else [residual_of, y])
    return y


def _last_dim_guess(b: Builder, y: str) -> int | None:
    """The last dim of a node output not inferred yet: its MatMul/Gemm weight's last dim."""
    node = next(n for n in b.nodes if y in n.output)
    if node.op_type not in ("MatMul", "Gemm"):
        return None
    w = next((t for t in b.inits if t.name == node.input[1]), None)
    if w is None or not w.dims:
        return None
    trans = any(a.name == "transB" and a.i == 1 for a in node.attribute)
    return int(w.dims[0] if trans else w.dims[-1])


def _channels(b: Builder, y: str) -> int:
    node = next(n for n in b.nodes if y in n.output)
    w = next(t for t in b.inits if t.name == node.input[1])
    return int(w.dims[0])


def conv_input(b: Builder, spatial: int) -> tuple:
    n = b.choice([1, 1, 1, 2, 2, 3] + ([0] if b.zero else []))
    c = b.choice([1, 2, 3, 4, 4, 6, 8, 8, 16])
    return (n, c) + tuple(b.int(1, 12) for _ in range(spatial))


def r_conv(b: Builder) -> str:
    spatial = b.choice([2, 2, 2, 2, 1, 1, 3])
    x = b.pick(ranks=[spatial + 2], new_prob=0.4, shape=lambda: conv_input(b, spatial),
               pred=lambda v: v.shape[1] > 0 and min(v.shape[2:]) > 0)
    if b.chance(0.15) and spatial == 2:  # the [2,1] stride with pads summing to kernel - 1, batch >= 2
        x = b.input((b.int(2, 3), b.int(1, 4), b.int(3, 10), b.int(3, 10)))
    shape = b.v(x).shape
    c, dims = shape[1], shape[2:]
    divisors = [g for g in range(1, c + 1) if c % g == 0]
    g = b.choice([1, 1, 1, c, c, b.choice(divisors)])
    m = g * b.int(1, 3) if g > 1 else b.int(1, 16)
    ks, ss, ds, pb, pe = [], [], [], [], []
    for d in dims:
        k = b.int(1, min(5, d + 2))
        dil = 2 if b.chance(0.15) else 1
        keff = dil * (k - 1) + 1
        s = 1 if b.chance(0.5) else b.int(2, 3)
        lo, hi = b.int(0, keff - 1), b.int(0, keff - 1)
        if d + lo + hi < keff:
            raise Skip("window larger than the padded input")
        ks.append(k), ss.append(s), ds.append(dil), pb.append(lo), pe.append(hi)
    if b.chance(0.15) and spatial == 2:  # strides [2,1], pads of the width summing to its kernel - 1
        ss = [2, 1]
        keff = ds[1] * (ks[1] - 1) + 1
        pb[1] = b.int(0, keff - 1)
        pe[1] = keff - 1 - pb[1]
    attrs = dict(kernel_shape=ks, strides=ss, dilations=ds, group=g)
    if b.chance(0.1):
        attrs["auto_pad"] = b.choice(["SAME_UPPER", "SAME_LOWER", "VALID"])
    else:
        attrs["pads"] = pb + pe
    fan_in = (c // g) * int(np.prod(ks))
    ins = [x, b.weight((m, c // g) + tuple(ks), fan_in)]
    if b.chance(0.6):
        ins.append(b.weight((m,), 1))
    y = b.node("Conv", ins, **attrs)
    if b.chance(0.2):
        y = b.node("BatchNormalization", [y, b.const(b.rng.uniform(0.5, 1.5, m).astype(np.float32)),
                                          b.weight((m,), 1), b.weight((m,), 1),
                                          b.const(b.rng.uniform(0.5, 2.0, m).astype(np.float32))],
                   epsilon=1e-5)
    y = _epilogue(b, y, spatial=spatial)
    if b.chance(0.3):  # residual: the input, when shapes agree, or another value of the result's shape
        if not b._infer():
            raise Skip("conv shape")
        b.node("Add", [y, b.same_shape(b.v(y).shape, avoid=(y,))])
    kind = "depthwise" if g == c and g > 1 else f"groups={g}"
    return (f"Conv{spatial}d N={shape[0]} C={c} M={m} {kind} k={ks} s={ss} d={ds} "
            f"{attrs.get('auto_pad') or 'pads=' + str(pb + pe)}")


def r_pool(b: Builder) -> str:
    spatial = b.choice([2, 2, 1])
    x = b.pick(ranks=[spatial + 2], shape=lambda: conv_input(b, spatial),
               pred=lambda v: min(v.shape[2:]) > 0)
    dims = b.v(x).shape[2:]
    op = b.choice(["MaxPool", "AveragePool", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
    if op.startswith("Global"):
        b.node(op, [x])
        return op
    ks = [b.int(1, min(4, d)) for d in dims]
    ds = [2 if op == "MaxPool" and b.chance(0.15) and d >= 2 * k else 1 for d, k in zip(dims, ks)]
    ss = [b.int(1, 3) for _ in dims]
    pads = [b.int(0, k - 1) for k in ks] + [b.int(0, k - 1) for k in ks]
    attrs = dict(kernel_shape=ks, strides=ss, pads=pads, ceil_mode=int(b.chance(0.3)))
    if op == "MaxPool":
        attrs["dilations"] = ds
    elif b.chance(0.4):
        attrs["count_include_pad"] = 1
    b.node(op, [x], exact=op == "MaxPool" and b.v(x).exact, **attrs)
    return f"{op} k={ks} s={ss} pads={pads} ceil={attrs['ceil_mode']}"


def _axes(b: Builder, rank: int, trailing: bool) -> list:
    if trailing:
        return list(range(rank - b.int(1, rank), rank))
    axes = sorted(b.rng.choice(rank, b.int(1, rank), replace=False).tolist())
    return [a - rank if b.chance(0.3) else a for a in axes]


def _defined_mean(op: str, shape, axes) -> None:
    """A mean over an empty set is undefined in ONNX (ReduceMean's spec): Kiln gives NaN as NumPy and
    PyTorch do, ONNX Runtime 0; such a model has no right answer to compare, so it is not drawn."""
    if op in ("ReduceMean", "GlobalAveragePool", "LayerNormalization"):
        over = range(len(shape)) if axes is None else axes
        if any(shape[a] == 0 for a in over):
            raise Skip(f"{op} over an empty set (undefined)")


def r_reduce(b: Builder) -> str:
    x = b.pick(ranks=range(1, 5))
    v = b.v(x)
    ops = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL2", "ReduceL1"]
    if v.scale < 20:
        ops.append("ReduceLogSumExp")
    op = b.choice(ops)
    keep = int(b.chance(0.5))
    axes = None if b.chance(0.15) else _axes(b, len(v.shape), b.chance(0.5))
    _defined_mean(op, v.shape, axes)
    if op == "ReduceSum":
        b.node(op, [x] + ([b.ints(axes)] if axes is not None else []), keepdims=keep)
    elif axes is None:
        b.node(op, [x], keepdims=keep)
    else:
        b.node(op, [x], keepdims=keep, axes=axes)
    return f"{op} axes={axes} keepdims={keep}"


def r_norm(b: Builder) -> str:
    x = b.pick(ranks=range(1, 5))
    rank = len(b.v(x).shape)
    op = b.choice(["Softmax", "LogSoftmax", "LayerNormalization", "LayerNormalization", "BatchNormalization"])
    axis = -1 if b.chance(0.6) else b.int(-rank, rank - 1)
    if op == "LayerNormalization":
        ins = [x, b.const(b.rng.uniform(0.5, 1.5, b.v(x).shape[axis:]).astype(np.float32))]
        if b.chance(0.6):
            ins.append(b.weight(b.v(x).shape[axis:], 1))
        b.node(op, ins, axis=axis, epsilon=float(b.choice([1e-5, 1e-3])), scale=5.0)
    elif op == "BatchNormalization":
        if rank < 2:
            raise Skip("BatchNormalization needs channels")
        c = b.v(x).shape[1]
        b.node(op, [x, b.weight((c,), 1), b.weight((c,), 1), b.weight((c,), 1),
                    b.const(b.rng.uniform(0.5, 2.0, c).astype(np.float32))], epsilon=1e-5)
    else:
        b.node(op, [x], axis=axis, scale=1.0 if op == "Softmax" else None)
    return f"{op} axis={axis}"


def r_rowchain(b: Builder) -> str:
    """An elementwise chain ending in the row reduction that reads it (the reduction rule)."""
    x = b.pick(ranks=range(2, 5), new_prob=0.4)
    shape = b.v(x).shape
    y = x
    for _ in range(b.int(1, 3)):
        op = b.choice(["Add", "Mul", "Relu", "Sub", "Tanh"])
        if op in ("Relu", "Tanh"):
            y = b.node(op, [y])
        else:
            other = b.weight(shape[-1:], 1) if b.chance(0.5) else b.same_shape(shape)
            y = b.node(op, [y, other])
    end = b.choice(["LayerNormalization", "Softmax", "LogSoftmax", "ReduceSum", "ReduceMean", "ReduceMax",
                    "GlobalAveragePool", "GlobalMaxPool"])
    if end.startswith("Global") and len(shape) != 4:
        end = "ReduceMean"
    axes = _axes(b, len(shape), True) if end.startswith("Reduce") else [2, 3] if end.startswith("Global") else [-1]
    _defined_mean(end, shape, axes)
    if end == "LayerNormalization":
        b.node(end, [y, b.const(np.ones(shape[-1:], np.float32)), b.weight(shape[-1:], 1)], axis=-1)
    elif end in ("Softmax", "LogSoftmax"):
        b.node(end, [y], axis=-1)
    elif end == "ReduceSum":
        b.node(end, [y, b.ints(axes)], keepdims=int(b.chance(0.5)))
    elif end.startswith("Reduce"):
        b.node(end, [y], axes=axes, keepdims=int(b.chance(0.5)))
    else:
        b.node(end, [y])
    return f"chain->{end}"


def r_attention(b: Builder) -> str:
    bsz, heads, seq, d = b.int(1, 2), b.int(1, 3), b.int(1, 9), b.int(1, 8)
    if b.chance(0.5):  # from one [B,S,H*D] input through projections and the head split
        x = b.input((bsz, seq, heads * d))
        q, k, v = (b.node("Transpose", [b.node("Reshape", [b.node("MatMul", [x, b.weight((heads * d,) * 2)]),
                                                            b.ints([bsz, seq, heads, d])])], perm=[0, 2, 1, 3])
                   for _ in range(3))
    else:
        q, k, v = (b.input((bsz, heads, seq, d)) for _ in range(3))
    kt = b.node("Transpose", [k], perm=[0, 1, 3, 2])
    s = b.node("MatMul", [q, kt])
    s = (b.node("Mul", [s, b.scalar(1 / math.sqrt(d))]) if b.chance(0.5)
         else b.node("Div", [s, b.scalar(math.sqrt(d))]))
    if b.chance(0.4):
        mask = b.const(np.where(b.rng.random((1, 1, seq, seq)) < 0.2, -1e4, 0).astype(np.float32))
        s = b.node("Add", [s, mask])
    p = b.node("Softmax", [s], axis=-1, scale=1.0)
    o = b.node("MatMul", [p, v])
    if b.chance(0.6):
        o = b.node("Reshape", [b.node("Transpose", [o], perm=[0, 2, 1, 3]), b.ints([bsz, seq, heads * d])])
    return f"attention B={bsz} H={heads} S={seq} D={d}"


def r_prologue(b: Builder) -> str:
    """Scale, shift and ReLU before a 1x1 conv (one image, one group): the prologue rule."""
    x = b.pick(ranks=[4], new_prob=0.5, pred=lambda v: v.shape[0] == 1 and v.shape[1] > 0,
               shape=lambda: (1, b.int(1, 16), b.int(1, 9), b.int(1, 9)))
    c = b.v(x).shape[1]
    y = b.node("Add", [b.node("Mul", [x, b.weight((c, 1, 1), 1)]), b.weight((c, 1, 1), 1)])
    y = b.node("Relu", [y])
    m = b.int(1, 24)
    ins = [y, b.weight((m, c, 1, 1), c)] + ([b.weight((m,), 1)] if b.chance(0.5) else [])
    _epilogue(b, b.node("Conv", ins, kernel_shape=[1, 1]), spatial=2)
    return f"prologue C={c} M={m}"


def r_shuffle(b: Builder) -> str:
    """A channel shuffle read by a depthwise conv (the shuffle rule)."""
    n, g, cg, h, w = b.int(1, 2), b.int(2, 4), b.int(1, 4), b.int(1, 8), b.int(1, 8)
    c = g * cg
    x = b.pick(ranks=[4], pred=lambda v: v.shape == (n, c, h, w), new_prob=0.5, shape=lambda: (n, c, h, w))
    y = b.node("Reshape", [x, b.ints([n, g, cg, h, w])])
    y = b.node("Transpose", [y], perm=[0, 2, 1, 3, 4])
    y = b.node("Reshape", [y, b.ints([n, c, h, w])])
    s = b.choice([1, 2])
    ins = [y, b.weight((c, 1, 3, 3), 9)] + ([b.weight((c,), 1)] if b.chance(0.5) else [])
    b.node("Conv", ins, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[s, s], group=c)
    return f"shuffle+depthwise N={n} g={g} C={c} s={s}"


def r_concat(b: Builder) -> str:
    x = b.pick(ranks=range(1, 5))
    shape = b.v(x).shape
    axis = b.int(-len(shape), len(shape) - 1)
    pieces = [x]
    for _ in range(b.int(1, 2)):
        s = list(shape)
        s[axis] = b.dim(0)
        fits = [n for n in b.order if b.v(n).dtype == F32 and len(b.v(n).shape) == len(shape) and all(
            a == c for i, (a, c) in enumerate(zip(b.v(n).shape, shape)) if i != axis % len(shape))]
        pieces.append(b.choice(fits) if fits and b.chance(0.5) else b.input(tuple(s)))
    b.node("Concat", pieces, axis=axis, exact=all(b.v(p).exact for p in pieces))
    return f"Concat axis={axis} x{len(pieces)}"


def r_split(b: Builder) -> str:
    x = b.pick(ranks=range(1, 5), pred=lambda v: max(v.shape) >= 2)
    shape = b.v(x).shape
    axis = b.choice([i for i, d in enumerate(shape) if d >= 2])
    d, n = shape[axis], b.int(2, 3)
    ex = b.v(x).exact
    if b.chance(0.5) or d % n:
        cuts = sorted(b.rng.integers(0, d + 1, n - 1).tolist()) if b.zero else sorted(
            b.rng.choice(np.arange(1, d), min(n - 1, d - 1), replace=False).tolist())
        sizes = np.diff([0] + cuts + [d]).tolist()
        b.node("Split", [x, b.ints(sizes)], n_out=len(sizes), axis=axis, exact=ex)
        return f"Split axis={axis} {sizes}"
    b.node("Split", [x], n_out=n, axis=axis, exact=ex)
    return f"Split axis={axis} into {n}"


def r_slice(b: Builder) -> str:
    x = b.pick(ranks=range(1, 5))
    shape = b.v(x).shape
    axes = _axes(b, len(shape), False)
    starts, ends, steps = [], [], []
    for a in axes:
        d = shape[a]
        step = b.choice([1, 1, 1, 2, 3, -1, -2])
        st, en = b.int(-d - 2, d + 2), b.int(-d - 2, d + 2)
        if step < 0:
            st, en = max(st, en), min(st, en)
            en = b.choice([en, -(1 << 40)])
        else:
            st, en = min(st, en), max(st, en)
            en = b.choice([en, 1 << 40])
        starts.append(st), ends.append(en), steps.append(step)
    b.node("Slice", [x, b.ints(starts), b.ints(ends), b.ints(axes), b.ints(steps)], exact=b.v(x).exact)
    return f"Slice axes={axes} steps={steps}"


def r_reshape(b: Builder) -> str:
    x = b.pick(ranks=range(0, 5), pred=lambda v: 0 not in v.shape)
    v = b.v(x)
    kind = b.choice(["reshape", "reshape", "flatten", "squeeze", "unsqueeze", "transpose", "transpose"])
    if kind == "flatten":
        b.node("Flatten", [x], axis=b.int(0, len(v.shape)), exact=v.exact)
    elif kind == "squeeze":
        ones = [i for i, d in enumerate(v.shape) if d == 1]
        if not ones:
            raise Skip("nothing to squeeze")
        b.node("Squeeze", [x, b.ints(ones[:b.int(1, len(ones))])], exact=v.exact)
    elif kind == "unsqueeze":
        if len(v.shape) > 3:
            raise Skip("rank")
        b.node("Unsqueeze", [x, b.ints([b.int(0, len(v.shape))])], exact=v.exact)
    elif kind == "transpose":
        if len(v.shape) < 2:
            raise Skip("rank")
        b.node("Transpose", [x], perm=b.rng.permutation(len(v.shape)).tolist(), exact=v.exact)
    else:
        total = int(np.prod(v.shape))
        factors = [p for p in _primes(total)]
        rank = b.int(1, 4)
        dims = [1] * rank
        for p in factors:
            dims[b.int(0, rank - 1)] *= p
        if b.chance(0.4):
            dims[b.int(0, rank - 1)] = -1
        if b.chance(0.2) and rank <= len(v.shape) and dims[0] == v.shape[0]:
            dims[0] = 0
        b.node("Reshape", [x, b.ints(dims)], exact=v.exact)
        return f"Reshape {list(v.shape)}->{dims}"
    return kind


def _primes(n: int) -> list:
    out, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


def r_pad(b: Builder) -> str:
    x = b.pick(ranks=range(1, 5))
    shape = b.v(x).shape
    mode = b.choice(["constant", "constant", "reflect", "edge"])
    pads = []
    for d in shape + shape:
        if mode == "reflect":
            pads.append(b.int(0, max(d - 1, 0)) if d > 1 else 0)
        elif mode == "edge" and d == 0:
            pads.append(0)
        else:
            pads.append(b.int(-1, 3) if d > 1 and mode == "constant" else b.int(0, 3))
    ins = [x, b.ints(pads)]
    if mode == "constant" and b.chance(0.5):
        ins.append(b.scalar(float(b.choice([0.5, -2.0]))))
    b.node("Pad", ins, mode=mode, exact=b.v(x).exact)
    return f"Pad {mode} {pads}"


def r_where(b: Builder) -> str:
    x = b.pick()
    shape = b.v(x).shape
    cshape = b.bcast_shape(shape)
    if b.chance(0.3):
        cond = b.input(cshape, BOOL)
    else:
        src = b.pick(ranks=[len(cshape)], pred=lambda v: v.exact and v.shape == cshape, new_prob=0.5,
                     shape=lambda: cshape)
        cond = b.node(b.choice(["Greater", "Less", "GreaterOrEqual"]), [src, b.scalar(0.0)], exact=True)
    y = b.const(b.rng.standard_normal(b.bcast_shape(shape)).astype(np.float32)) if b.chance(0.5) else b.scalar(0.0)
    b.node("Where", [cond, x, y] if b.chance(0.7) else [cond, y, x])
    return "Where"


def r_cast(b: Builder) -> str:
    kind = b.choice(["f2i", "i2f", "int", "f2f", "bool"])
    if kind in ("f2i", "f2f", "bool"):
        x = b.pick(pred=lambda v: v.exact, new_prob=0.4)
        if kind == "f2f":
            to = b.choice([TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32])
            b.node("Cast", [b.node("Cast", [x], to=to, exact=True)], to=F32, exact=True)
        else:
            b.node("Cast", [x], to=I64 if kind == "f2i" else BOOL, exact=True)
        return f"Cast {kind}"
    x = b.pick(dtype=I64, new_prob=0.5)
    if kind == "int":
        op = b.choice(["Add", "Sub", "Mul", "Max", "Min", "Div", "Neg", "Abs", "Equal", "Greater"])
        if op in ("Neg", "Abs"):
            b.node(op, [x], exact=True)
        else:
            c = b.rng.integers(1, 4, b.bcast_shape(b.v(x).shape)).astype(np.int64)
            if op != "Div":
                c -= 2
            b.node(op, [x, b.const(c)], exact=True)
        return f"int64 {op}"
    b.node("Cast", [x], to=F32, exact=True)
    return "Cast i2f"


def r_gather(b: Builder) -> str:
    x = b.pick(ranks=range(1, 4), pred=lambda v: min(v.shape) > 0)
    shape = b.v(x).shape
    axis = b.int(-len(shape), len(shape) - 1)
    d = shape[axis]
    idx = b.rng.integers(-d, d, size=tuple(b.int(1, 3) for _ in range(b.int(0, 2))))
    b.node("Gather", [x, b.const(idx.astype(np.int64))], axis=axis, exact=b.v(x).exact)
    return f"Gather axis={axis}"


def r_shape_arith(b: Builder) -> str:
    """Reshape to [d0, -1] through Shape, Gather, Unsqueeze, Concat (constant folding's work)."""
    x = b.pick(ranks=range(2, 5), pred=lambda v: 0 not in v.shape)
    d0 = b.node("Unsqueeze", [b.node("Gather", [b.node("Shape", [x]), b.ints(0)]), b.ints([0])])
    b.node("Reshape", [x, b.node("Concat", [d0, b.ints([-1])], axis=0)], exact=b.v(x).exact)
    return "Reshape(Shape)"


def r_expand(b: Builder) -> str:
    x = b.pick(ranks=range(0, 4))
    shape = b.v(x).shape
    target = [b.int(2, 4) if d == 1 and b.chance(0.6) else d for d in shape]
    if b.chance(0.4):
        target = [b.int(1, 3)] + target
    if b.chance(0.5):
        b.node("Expand", [x, b.ints(target)], exact=b.v(x).exact)
        return f"Expand {list(shape)}->{target}"
    b.node("Tile", [x, b.ints([b.int(1, 3) for _ in shape])], exact=b.v(x).exact)
    return "Tile"


RECIPES = {r_unary: 10, r_binary: 12, r_variadic: 2, r_matmul: 10, r_conv: 12, r_pool: 5, r_reduce: 6,
           r_norm: 6, r_rowchain: 5, r_attention: 3, r_prologue: 3, r_shuffle: 2, r_concat: 5, r_split: 3,
           r_slice: 4, r_reshape: 6, r_pad: 3, r_where: 3, r_cast: 4, r_gather: 3, r_shape_arith: 2,
           r_expand: 3}
