"""The ``torch.compile`` backend: ``torch.compile(model, backend="kiln")`` (the ATen lowering is the
frontend's, ``frontends/torch``; compiling and running its graphs is here, in the driver layer).

    import torch
    fast = torch.compile(model.eval(), backend="kiln")       # no import of Kiln needed (entry point)
    with torch.no_grad():
        y = fast(x)

What the backend does with each graph dynamo hands it (``kiln_backend``):

1. parameters and buffers (dynamo passes them as inputs: ``nn.Parameter`` instances and inputs named
   ``..._buffers_...``) are frozen: they become constants of the compiled model (inference only; a
   changed weight needs a new ``torch.compile``);
2. the graph is traced to core ATen ops (``make_fx`` with ``core_aten_decompositions``; PyTorch keeps
   ``gelu``, ``native_layer_norm`` and ``_softmax`` whole, which Kiln has as ops, and the table here
   keeps 2-D upsampling whole: ``_decompositions``);
3. it is partitioned (``CapabilityBasedPartitioner``): the nodes with a Kiln lowering
   (``lowerings.LOWERINGS``) in maximal groups, each imported into Kiln's IR (``importer.py``),
   compiled by ``compiler.compile`` (for the inputs' shapes, or per size: below) and run natively; the other nodes
   stay in PyTorch; ``last_report`` (and the ``kiln`` logger) say what ran where and why;
4. the result is the partitioned module: tensors in, tensors out (NumPy views, no copies in; the
   outputs are the compiled model's arrays, wrapped); when the whole graph is one Kiln partition, a
   function calling it straight instead (``last_report["direct"]``: no FX module or ``nn.Module``
   call around it per run).

``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` run as Kiln's recurrent layers: importing this module (which
``torch.compile(backend="kiln")`` does) turns on dynamo's ``allow_rnn``, so that it traces them
into one call each, which ``frontends.torch.recurrent`` keeps whole (not unrolled step by step).

Shapes: a graph with static shapes is compiled for them (dynamo guards them: a new shape gives a new
graph). A graph with sizes dynamo made dynamic (``dynamic=True``, ``mark_dynamic``, or a size that
changed between calls) is traced once with those sizes symbolic (``_trace``, under dynamo's own fake
tensors); each Kiln partition then has them as symbolic dimensions of its IR (``s0``), and runs native
code compiled per size on first use (``specialize.PerSize``, the ``cache`` most recent sizes kept).
Where the symbolic trace would add a guard (dynamo has made its guards already: a size-dependent
branch would be baked in), or a partition cannot take a size known only at run time (a lowering that
needs it when compiling), the whole graph is compiled per input signature instead, as a static one
(``_PerShape``), with the reason in ``last_report["symbolic"]["per shape"]``. Importing this module
also sets dynamo's ``specialize_float`` (``_configure_dynamo``).

Training (an input or parameter that needs gradients with grad mode on) is out of scope: such a graph
runs in PyTorch, with a warning.

``options`` (``torch.compile(..., options={...})``): ``opt_level`` (default 2), ``nthreads``,
``quantize`` (as ``compiler.compile``), ``cache`` (default 8: the sizes kept per partition, or the
input signatures kept for a graph compiled per shape).
"""
from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Sequence

log = logging.getLogger("kiln")

#: what the last call of the backend did: {"partitions": [...], "in_torch": {op: reason}, ...}
last_report: dict = {}


def _configure_dynamo() -> None:
    """Two settings of dynamo's, made when this module is imported (which ``torch.compile(backend=
    "kiln")`` does before dynamo traces anything; without torch loaded, nothing to do):

    * ``allow_rnn``: dynamo traces ``nn.LSTM``/``GRU``/``RNN`` (by default it breaks the graph there
      and runs them in PyTorch), so that they reach the backend as one call each
      (``frontends/torch/recurrent.py``);
    * ``specialize_float``: a module's float attributes (a LayerNorm's ``eps``, an Embedding's
      ``norm_type``) stay constants. Otherwise, with dynamic shapes, dynamo passes each as a 0-d tensor
      input that the graph reads with ``.item()``, which no trace to ATen can follow."""
    import sys

    if "torch" in sys.modules:
        import torch._dynamo

        torch._dynamo.config.allow_rnn = True
        torch._dynamo.config.specialize_float = True


_configure_dynamo()


def _frozen(gm, example_inputs) -> dict[int, Any]:
    """The positions of the inputs that are parameters or buffers, with their tensors."""
    import torch

    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    out = {}
    for i, (name, t) in enumerate(zip(names, example_inputs)):
        if isinstance(t, torch.nn.Parameter) or "_buffers_" in name or "_parameters_" in name:
            out[i] = t
    return out


class _KilnPart:
    """A partition compiled by Kiln, called with the partition's non-constant inputs (``exe``: an
    executable, or a ``PerSize`` one where the partition has sizes known only at run time; then
    ``in_torch``, the partition's ATen graph, runs the sizes Kiln fails to compile)."""

    def __init__(self, exe, taken: Sequence[int], single: bool, in_torch=None, needs: Sequence[int] = ()):
        self.exe, self.taken, self.single, self.in_torch = exe, list(taken), single, in_torch
        #: the arguments a caller must pass (the others may be None): Kiln's, and with ``in_torch``
        #: every one that is not a frozen constant (PyTorch reads the sizes too)
        self.needs = sorted(set(self.taken) | set(needs))
        self.warned: set[str] = set()
        self.names = exe.input_names

    def __call__(self, *args):
        from torch import from_numpy

        from .specialize import SizeCompileError

        # positional (the executable's fast path checks each array's type, shape and layout)
        try:
            outs = self.exe(*[_array(args[i]) for i in self.taken])
        except SizeCompileError as e:
            if self.in_torch is None:
                raise
            if str(e) not in self.warned:
                self.warned.add(str(e))
                log.warning("kiln: this size runs in PyTorch: %s", e)
            return self.in_torch(*args)
        if len(self.exe.output_names) == 1:
            res = (from_numpy(outs),)
        else:
            res = tuple(from_numpy(o) for o in outs)
        return res[0] if self.single else res


def _with_constants(sub, consts: dict):
    """``sub`` (a partition's ATen graph) called as a ``_KilnPart`` is: the frozen inputs at the
    positions of ``consts`` may come as None (the direct call passes only the others)."""
    def run(*args):
        return sub(*[consts.get(j, a) for j, a in enumerate(args)])
    return run


def _array(t):
    """A CPU tensor's data as a NumPy array (a view; ``Executable`` copies a non-contiguous one)."""
    try:
        return t.numpy()  # (the common case: a CPU tensor that needs no gradient)
    except (RuntimeError, TypeError):
        pass
    if t.device.type != "cpu":
        t = t.cpu()
    if t.requires_grad:
        t = t.detach()
    return (t if t.is_contiguous() else t.contiguous()).numpy()


def kiln_backend(gm, example_inputs, options: dict | None = None, **kwargs):
    """The ``torch.compile`` backend (see the module docstring)."""
    import torch

    opts = dict(options or {}, **kwargs)
    unknown = set(opts) - {"opt_level", "nthreads", "quantize", "cache", "kernel_cache"}
    if unknown:
        raise ValueError(f"unknown kiln backend option(s) {sorted(unknown)}; options: opt_level, nthreads, quantize, "
                         f"cache, kernel_cache")
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs):
        msg = ("kiln: this graph needs gradients (grad mode on, an input or parameter requires grad); Kiln "
               "compiles inference only, so it runs in PyTorch. Call the model under torch.no_grad() or "
               "torch.inference_mode().")
        warnings.warn(msg, stacklevel=2)
        last_report.clear()
        last_report.update(in_torch={"*": "gradients needed"}, partitions=[])
        return gm.forward
    return _PerShape(gm, opts)


class _PerShape:
    """The graph compiled at its first call: once for every size where dynamo made some sizes symbolic
    and every partition takes them (``_compile(symbolic=True)``), else per input signature (shapes,
    dtypes, and the values of size arguments that dynamo passes for dynamic dimensions), the ``cache``
    (default 8) most recent kept."""

    def __init__(self, gm, opts: dict):
        from collections import OrderedDict

        self.gm, self.opts = gm, opts
        self.cache: OrderedDict = OrderedDict()
        self.size = int(opts.get("cache", 8))
        self.varying: list[int] | None = None  # the inputs that are not frozen parameters
        self.symbolic = None  # the function for every size, when the graph compiled with symbolic sizes
        self.per_shape_why: str | None = None  # why a graph with symbolic sizes is compiled per shape

    def __call__(self, *args):
        import torch

        if self.symbolic is not None:
            return self.symbolic(*args)
        if self.varying is None:
            frozen = _frozen(self.gm, args)
            self.varying = [i for i in range(len(args)) if i not in frozen]
            if _has_symbolic_sizes(self.gm):
                try:
                    self.symbolic = _compile(self.gm, args, self.opts, symbolic=True)
                    return self.symbolic(*args)
                except _NotSymbolic as e:
                    self.per_shape_why = str(e)
                    log.info("kiln: the graph is compiled per shape: %s", e)
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
                    for a in (args[i] for i in self.varying))
        fn = self.cache.get(key)
        if fn is None:
            fn = _compile(self.gm, args, self.opts)
            if self.per_shape_why is not None:
                last_report["symbolic"] = {"per shape": self.per_shape_why}
            self.cache[key] = fn
            while len(self.cache) > self.size:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(key)
        return fn(*args)


class _NotSymbolic(Exception):
    """A partition cannot take the graph's symbolic sizes (the message says which and why)."""


def _has_symbolic_sizes(gm) -> bool:
    """Whether dynamo gave the graph sizes known only at run time (a ``SymInt`` input, or a tensor input
    with a symbolic size)."""
    import torch

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            ex = node.meta.get("example_value")
            if isinstance(ex, torch.SymInt) or (isinstance(ex, torch.Tensor) and any(
                    isinstance(d, torch.SymInt) for d in ex.shape)):
                return True
    return False


@functools.lru_cache(maxsize=1)
def _decompositions() -> dict:
    """``core_aten_decompositions()`` (a new table of some 600 entries each call: made once), with
    nearest and bilinear 2-D upsampling kept whole (Kiln has them as Resize; decomposed, they are
    advanced indexing with several index tensors, which it does not lower): their ``.vec`` forms
    (scale factors) become the ``.default`` ones (output sizes)."""
    import torch
    from torch._decomp import core_aten_decompositions
    from torch._decomp.decompositions import get_scale_value, upsample_compute_output_size

    aten = torch.ops.aten

    def sized(op):
        def decompose(x, output_size, *args):  # (bilinear: align_corners, scale_factors; nearest: scale_factors)
            factors = args[-1]
            size = upsample_compute_output_size(x.size(), output_size, factors)
            return op(x, size, *args[:-1], *[get_scale_value(factors, i) for i in range(len(size))])
        return decompose

    table = dict(core_aten_decompositions())
    table.pop(aten.upsample_nearest2d.default, None)
    table[aten.upsample_nearest2d.vec] = sized(aten.upsample_nearest2d.default)
    table[aten.upsample_bilinear2d.vec] = sized(aten.upsample_bilinear2d.default)
    return table


def _trace(gm, example_inputs, symbolic: bool):
    """The graph traced to core ATen ops, with each node's result (a fake tensor) in ``meta["val"]``,
    and the example inputs the trace used: the real ones, or with ``symbolic`` dynamo's fake ones, so
    that sizes dynamo made symbolic stay symbolic."""
    import torch
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from frontends.torch.recurrent import keep_recurrent

    keep_recurrent(gm)  # nn.LSTM/GRU/RNN as one op each (make_fx would unroll them step by step)
    # functionalized: in-place ops (relu_, add_) become their pure forms, so the import stays SSA
    table = _decompositions()
    with torch.no_grad():
        if symbolic:
            fakes = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
            mode = next((f.fake_mode for f in fakes if isinstance(f, torch.Tensor)), None)
            if mode is None or mode.shape_env is None or any(f is None for f in fakes):
                raise _NotSymbolic("dynamo's fake inputs or their sizes are missing")
            # a guard now (a decomposition that branches on a size, or fixes it) would hold for this
            # size only, and dynamo has made its guards already: refused, so nothing size-dependent
            # is baked into the trace
            try:
                with mode, enable_python_dispatcher(), mode.shape_env.error_on_new_guards():
                    # decomposed first, then functionalized: functionalizing the module's own ops
                    # (C++) reads the sizes of some (linear) as numbers, which fixes them
                    plain = make_fx(gm, decomposition_table=table, tracing_mode="real")(*fakes)
                    fn = torch.func.functionalize(plain, remove="mutations")
                    aten_gm = make_fx(fn, decomposition_table=table, tracing_mode="real")(*fakes)
            except Exception as e:  # (or a value read as a Python number: data-dependent)
                raise _NotSymbolic(f"tracing with symbolic sizes: {type(e).__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}") from e
            examples = fakes
        else:
            fn = torch.func.functionalize(gm, remove="mutations")
            # one fake mode for the values make_fx records (without it, a new one per value, each
            # taking a Python stack trace: 0.15 s of BERT-style's trace)
            with tracing(TracingContext(FakeTensorMode(allow_non_fake_inputs=True))):
                aten_gm = make_fx(fn, decomposition_table=table, tracing_mode="real")(*example_inputs)
            examples = example_inputs
        aten_gm.graph.eliminate_dead_code()  # (e.g. a max pool's unused indices)
        aten_gm.recompile()
        # every node's result (a fake tensor: shape and dtype) in node.meta["val"]: make_fx records
        # them; propagated here only where a node has none
        if any(n.op == "call_function" and "val" not in n.meta for n in aten_gm.graph.nodes):
            FakeTensorProp(aten_gm, mode=FakeTensorMode(allow_non_fake_inputs=True)).propagate(*examples)
    return aten_gm, examples


def _compile(gm, example_inputs, opts: dict, symbolic: bool = False):
    from .driver import fewer_collections

    with fewer_collections():  # (the trace and the import too: see driver.COMPILE_GC_THRESHOLD)
        return _compile_graph(gm, example_inputs, opts, symbolic)


def _compile_graph(gm, example_inputs, opts: dict, symbolic: bool = False):
    """The graph for these inputs: traced to ATen, partitioned, each supported part compiled by Kiln.
    With ``symbolic``, for every size (raises ``_NotSymbolic`` where a partition cannot take that)."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupport

    from frontends.torch import import_fx, supported

    from .driver import compile as kiln_compile
    from .specialize import DEFAULT_CACHE, PerSize, symbolic_dims

    last_report.clear()
    frozen = _frozen(gm, example_inputs)
    aten_gm, examples_in = _trace(gm, example_inputs, symbolic)
    refusals: dict[str, str] = {}

    class Support(OperatorSupport):
        def is_node_supported(self, submodules, node) -> bool:
            if node.op != "call_function":
                return False
            why = supported(node)
            if why:
                refusals[str(node.target)] = why
            return why is None

    parts = CapabilityBasedPartitioner(aten_gm, Support(), allows_single_node_partition=True).partition_and_fuse()
    placeholders = [n for n in parts.graph.nodes if n.op == "placeholder"]
    position = {n: i for i, n in enumerate(placeholders)}
    opt_level, nthreads = int(opts.get("opt_level", 2)), opts.get("nthreads")
    kernel_cache = bool(opts.get("kernel_cache", True))
    report, sizes = [], {}
    for node in list(parts.graph.nodes):
        if node.op != "call_module":
            continue
        sub = getattr(parts, node.target)
        # the partition's inputs: constants where the parent passes a frozen parameter
        args = list(node.args)
        consts = {j: frozen[position[a]] for j, a in enumerate(args) if a in position and position[a] in frozen}
        examples = [_example(a, examples_in, position, symbolic) for a in args]
        try:
            graph, taken = import_fx(sub, examples, consts, name=node.target)
            dims = symbolic_dims(graph)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if dims:  # native code per size, compiled when a size is first run
                    exe = PerSize(graph, dict(opt_level=opt_level, nthreads=nthreads, quantize=opts.get("quantize"),
                                              kernel_cache=kernel_cache),
                                  cache=int(opts.get("cache", DEFAULT_CACHE)))
                    exe.specialized(_sizes_now(graph, taken, examples))  # this call's, compiled now
                    sizes[node.target] = sorted(dims)
                else:
                    exe = kiln_compile(graph, opt_level, nthreads=nthreads, quantize=opts.get("quantize"),
                                       kernel_cache=kernel_cache)
        except Exception as e:  # a partition Kiln cannot take after all stays in PyTorch
            if symbolic:
                raise _NotSymbolic(f"partition {node.target}: {type(e).__name__}: {e}") from e
            log.warning("kiln: partition %s runs in PyTorch: %s", node.target, e)
            refusals[node.target] = f"{type(e).__name__}: {e}"
            continue
        out = [n for n in sub.graph.nodes if n.op == "output"][0].args[0]
        single = not isinstance(out, (list, tuple))
        in_torch, needs = None, ()
        if isinstance(exe, PerSize):  # (a size Kiln fails to compile runs in PyTorch)
            in_torch, needs = _with_constants(sub, consts), [j for j in range(len(args)) if j not in consts]
        setattr(parts, node.target, _Module(_KilnPart(exe, taken, single, in_torch, needs)))
        ops = sorted({_op_name(n.target) for n in sub.graph.nodes if n.op == "call_function"})
        first = exe.specializations[-1][1] if isinstance(exe, PerSize) else exe  # (this call's size)
        report.append({"partition": node.target, "nodes": sum(1 for n in sub.graph.nodes if n.op == "call_function"),
                       "ops": ops, "kernels": len(first.kernels), "interpreted": [f["op"] for f in first.fallback]})
    parts.recompile()
    last_report.update(partitions=report, in_torch=refusals)
    if symbolic:
        last_report["symbolic"] = sizes
    for r in report:
        per_size = f" (native code per size of {', '.join(sizes[r['partition']])})" if r["partition"] in sizes else ""
        log.info("kiln: %s: %d node(s) natively in %d kernel(s)%s", r["partition"], r["nodes"], r["kernels"], per_size)
    for target, why in refusals.items():
        log.info("kiln: in PyTorch: %s (%s)", target, why)
    direct = _direct(parts, position)
    last_report["direct"] = direct is not None
    return direct or parts.forward


def _direct(parts, position):
    """When the whole graph is one Kiln partition of the graph's inputs whose results are returned
    as they are: a function calling it straight (no FX module or ``nn.Module`` call in between:
    microseconds per call on a small model). Else None."""
    nodes = [n for n in parts.graph.nodes if n.op != "placeholder"]
    calls = [n for n in nodes if n.op == "call_module"]
    if len(calls) != 1:
        return None
    call = calls[0]
    part = getattr(getattr(parts, call.target), "fn", None)  # a KilnModule's part, else None
    if not isinstance(part, _KilnPart) or any(a not in position for a in call.args):
        return None
    picks = {}  # node -> the index of the part's results it is (None: the single result)
    for n in nodes:
        if n is call:
            picks[n] = None
        elif n.op == "call_function" and getattr(n.target, "__name__", "") == "getitem" and n.args[0] is call \
                and isinstance(n.args[1], int) and not part.single:
            picks[n] = n.args[1]
        elif n.op != "output":
            return None
    out = [n for n in nodes if n.op == "output"][0].args[0]
    items = list(out) if isinstance(out, (list, tuple)) else [out]
    if any(i not in picks or (picks[i] is None) != part.single for i in items):
        return None
    where = [position[a] for a in call.args]
    needed = [where[i] for i in part.needs]
    container = type(out) if isinstance(out, (list, tuple)) else None
    spec = [picks[i] for i in items]
    n = len(call.args)

    def run(*args):
        part_args = [None] * n  # (the frozen ones are constants of the part: not read)
        for j, p in zip(part.needs, needed):
            part_args[j] = args[p]
        res = part(*part_args)
        got = [res if k is None else res[k] for k in spec]
        return container(got) if container is not None else got[0]

    return run



def _op_name(target) -> str:
    """``add`` for ``aten.add.Tensor`` (``lstm`` for ``kiln.lstm.default``), ``mul`` for
    ``operator.mul`` (arithmetic on sizes)."""
    import torch

    name = str(target)
    return name.split(".")[1] if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", name)


def _sizes_now(graph, taken, examples) -> dict[str, int]:
    """The sizes of ``graph``'s symbolic dimensions in the call being compiled (the hints of dynamo's
    symbols: the sizes of the example inputs)."""
    from torch.fx.experimental.symbolic_shapes import optimization_hint

    from .specialize import symbolic_dims

    by_name = {v.name: examples[j] for v, j in zip(graph.inputs, taken)}
    return {dim: optimization_hint(by_name[name].shape[axis]) for dim, ((name, axis), *_) in symbolic_dims(graph).items()}


def _example(arg, example_inputs, position, symbolic: bool = False):
    """The example value of a partition input: a parent placeholder's example, else the traced meta
    (a fake tensor or a size, where the sizes are symbolic)."""
    if arg in position:
        return example_inputs[position[arg]]
    val = arg.meta.get("val")
    import torch

    if symbolic and isinstance(val, (torch.Tensor, torch.SymInt)):
        return val
    if isinstance(val, torch.Tensor):
        return torch.empty([int(d) for d in val.shape], dtype=val.dtype)
    raise ValueError(f"no example value for {arg}")


def _Module(fn):
    import torch

    class KilnModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fn = fn

        def forward(self, *args):
            return self.fn(*args)

    return KilnModule()


__all__ = ["kiln_backend", "last_report"]
