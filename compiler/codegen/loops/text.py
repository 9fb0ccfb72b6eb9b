"""The loop form as text, for reading (``kiln dump --kernels``) and for tests::

    kernel k2_Add_Relu(x: f32[4,8] in, y: f32[4,8] out) {
      parallel for i0 in 0..4 {
        vector for i1 in 0..8 {
          let t0 = add(x[i0, i1], 2.0:f32)
          y[i0, i1] = max(t0, 0.0:f32)
        }
      }
    }

Buffers with other than dense strides show them (``x: f32[4,8] strides [0,1] in``); constants show
their type; an expression used twice is printed twice (lowerings name shared values with ``let``).
"""
from __future__ import annotations

from .expr import Const, Expr, Load, Op, Var
from .form import Acc, Buffer, Check, Kernel, Let, Loop, Store, Update, dense_strides


def expr_text(e: Expr) -> str:
    if isinstance(e, Const):
        if e.dtype.is_float:
            return f"{e.value!r}:{e.dtype}"
        return f"{str(e.value).lower() if isinstance(e.value, bool) else e.value}:{e.dtype}"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Load):
        return f"{e.buf.name}[{', '.join(expr_text(i) for i in e.index)}]"
    if isinstance(e, Op):
        args = ", ".join(expr_text(a) for a in e.args)
        return f"cast<{e.dtype}>({args})" if e.prim == "cast" else f"{e.prim}({args})"
    raise TypeError(f"not an expression: {e!r}")


def buffer_text(b: Buffer) -> str:
    dims = ",".join(map(str, b.shape))
    strides = "" if b.strides == dense_strides(b.shape) else f" strides [{','.join(map(str, b.strides))}]"
    return f"{b.name}: {b.dtype}[{dims}]{strides} {b.role}"


def _lines(stmts, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    for s in stmts:
        if isinstance(s, Loop):
            kind = "" if s.kind == "serial" else f"{s.kind} "
            grain = f" grain {s.grain}" if s.kind == "parallel" and s.grain > 1 else ""
            extent = s.extent.name if isinstance(s.extent, Var) else s.extent
            out.append(f"{pad}{kind}for {s.var.name} in 0..{extent}{grain} {{")
            _lines(s.body, depth + 1, out)
            out.append(f"{pad}}}")
        elif isinstance(s, Let):
            out.append(f"{pad}let {s.var.name} = {expr_text(s.value)}")
        elif isinstance(s, Acc):
            out.append(f"{pad}acc {s.var.name} = {expr_text(s.init)}")
        elif isinstance(s, Update):
            out.append(f"{pad}{s.var.name} {s.combiner}= {expr_text(s.value)}")
        elif isinstance(s, Store):
            out.append(f"{pad}{s.buf.name}[{', '.join(expr_text(i) for i in s.index)}] = {expr_text(s.value)}")
        elif isinstance(s, Check):
            out.append(f"{pad}fail_if {expr_text(s.bad)}: {expr_text(s.value)} outside [-{s.limit}, {s.limit})")
        else:
            raise TypeError(f"not a statement: {s!r}")


def print_kernel(k: Kernel) -> str:
    params = [buffer_text(b) for b in k.buffers] + [f"{v.name}: size <= {bound}" for v, bound in k.sizes]
    out = [f"kernel {k.name}({', '.join(params)}) {{"]
    out += [f"  # {n}" for n in k.notes]
    _lines(k.body, 1, out)
    out.append("}")
    return "\n".join(out)
