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
   ``gelu``, ``native_layer_norm`` and ``_softmax`` whole, which Kiln has as ops);
3. it is partitioned (``CapabilityBasedPartitioner``): the nodes with a Kiln lowering
   (``lowerings.LOWERINGS``) in maximal groups, each imported into Kiln's IR (``importer.py``),
   compiled by ``compiler.compile`` for the example inputs' shapes and run natively; the other nodes
   stay in PyTorch; ``last_report`` (and the ``kiln`` logger) say what ran where and why;
4. the result is the partitioned module: tensors in, tensors out (NumPy views, no copies in; the
   outputs are the compiled model's arrays, wrapped); when the whole graph is one Kiln partition, a
   function calling it straight instead (``last_report["direct"]``: no FX module or ``nn.Module``
   call around it per run).

``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` run as Kiln's recurrent layers: importing this module (which
``torch.compile(backend="kiln")`` does) turns on dynamo's ``allow_rnn``, so that it traces them
into one call each, which ``frontends.torch.recurrent`` keeps whole (not unrolled step by step).

Dynamo guards the shapes: a new input shape compiles again. Training (an input or parameter that
needs gradients with grad mode on) is out of scope: such a graph runs in PyTorch, with a warning.

``options`` (``torch.compile(..., options={...})``): ``opt_level`` (default 2), ``nthreads``,
``quantize`` (as ``compiler.compile``).
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Sequence

log = logging.getLogger("kiln")

#: what the last call of the backend did: {"partitions": [...], "in_torch": {op: reason}, ...}
last_report: dict = {}


def _trace_recurrent_layers() -> None:
    """Let dynamo trace ``nn.LSTM``/``GRU``/``RNN`` (``allow_rnn``; by default it breaks the graph
    there and runs them in PyTorch), so that they reach the backend as one call each
    (``frontends/torch/recurrent.py``). Done when this module is imported, which
    ``torch.compile(backend="kiln")`` does before dynamo traces anything; without torch loaded,
    nothing to do."""
    import sys

    if "torch" in sys.modules:
        import torch._dynamo

        torch._dynamo.config.allow_rnn = True


_trace_recurrent_layers()


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
    """A partition compiled by Kiln, called with the partition's non-constant inputs."""

    def __init__(self, exe, taken: Sequence[int], single: bool):
        self.exe, self.taken, self.single = exe, list(taken), single
        self.names = exe.input_names

    def __call__(self, *args):
        from torch import from_numpy

        # positional (the executable's fast path checks each array's type, shape and layout)
        outs = self.exe(*[_array(args[i]) for i in self.taken])
        if len(self.exe.output_names) == 1:
            res = (from_numpy(outs),)
        else:
            res = tuple(from_numpy(o) for o in outs)
        return res[0] if self.single else res


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
    unknown = set(opts) - {"opt_level", "nthreads", "quantize", "cache"}
    if unknown:
        raise ValueError(f"unknown kiln backend option(s) {sorted(unknown)}; options: opt_level, nthreads, quantize, "
                         f"cache")
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
    """The graph compiled per input signature (shapes, dtypes, and the values of size arguments that
    dynamo passes for dynamic dimensions), at its first call; the ``cache`` (default 8) most recent
    kept. So a graph dynamo made dynamic still runs static native code, specialized per size."""

    def __init__(self, gm, opts: dict):
        from collections import OrderedDict

        self.gm, self.opts = gm, opts
        self.cache: OrderedDict = OrderedDict()
        self.size = int(opts.get("cache", 8))
        self.varying: list[int] | None = None  # the inputs that are not frozen parameters

    def __call__(self, *args):
        import torch

        if self.varying is None:
            frozen = _frozen(self.gm, args)
            self.varying = [i for i in range(len(args)) if i not in frozen]
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
                    for a in (args[i] for i in self.varying))
        fn = self.cache.get(key)
        if fn is None:
            fn = _compile_static(self.gm, args, self.opts)
            self.cache[key] = fn
            while len(self.cache) > self.size:
                self.cache.popitem(last=False)
        else:
            self.cache.move_to_end(key)
        return fn(*args)


def _compile_static(gm, example_inputs, opts: dict):
    """The graph for these inputs: traced to ATen, partitioned, each supported part compiled by Kiln."""
    import torch
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupport

    from frontends.torch import import_fx, supported
    from frontends.torch.recurrent import keep_recurrent

    from .driver import compile as kiln_compile

    last_report.clear()
    frozen = _frozen(gm, example_inputs)
    keep_recurrent(gm)  # nn.LSTM/GRU/RNN as one op each (make_fx would unroll them step by step)
    with torch.no_grad():
        # functionalized: in-place ops (relu_, add_) become their pure forms, so the import stays SSA
        aten_gm = make_fx(torch.func.functionalize(gm, remove="mutations"),
                          decomposition_table=core_aten_decompositions(), tracing_mode="real")(*example_inputs)
        aten_gm.graph.eliminate_dead_code()  # (e.g. a max pool's unused indices)
        aten_gm.recompile()
        # static shapes and dtypes in node.meta["val"] (constants the trace captured are real tensors)
        FakeTensorProp(aten_gm, mode=FakeTensorMode(allow_non_fake_inputs=True)).propagate(*example_inputs)

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
    report = []
    for node in list(parts.graph.nodes):
        if node.op != "call_module":
            continue
        sub = getattr(parts, node.target)
        # the partition's inputs: constants where the parent passes a frozen parameter
        args = list(node.args)
        consts = {j: frozen[position[a]] for j, a in enumerate(args) if a in position and position[a] in frozen}
        examples = [_example(a, example_inputs, position) for a in args]
        try:
            graph, taken = import_fx(sub, examples, consts, name=node.target)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exe = kiln_compile(graph, int(opts.get("opt_level", 2)), nthreads=opts.get("nthreads"),
                                       quantize=opts.get("quantize"))
        except Exception as e:  # a partition Kiln cannot take after all stays in PyTorch
            log.warning("kiln: partition %s runs in PyTorch: %s", node.target, e)
            refusals[node.target] = f"{type(e).__name__}: {e}"
            continue
        out = [n for n in sub.graph.nodes if n.op == "output"][0].args[0]
        single = not isinstance(out, (list, tuple))
        setattr(parts, node.target, _Module(_KilnPart(exe, taken, single)))
        ops = sorted({str(n.target).split(".")[1] if "." in str(n.target) else str(n.target)
                      for n in sub.graph.nodes if n.op == "call_function"})
        report.append({"partition": node.target, "nodes": sum(1 for n in sub.graph.nodes if n.op == "call_function"),
                       "ops": ops, "kernels": len(exe.kernels), "interpreted": [f["op"] for f in exe.fallback]})
    parts.recompile()
    last_report.update(partitions=report, in_torch=refusals)
    for r in report:
        log.info("kiln: %s: %d node(s) natively in %d kernel(s)", r["partition"], r["nodes"], r["kernels"])
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
    taken = [where[i] for i in part.taken]
    container = type(out) if isinstance(out, (list, tuple)) else None
    spec = [picks[i] for i in items]
    n = len(call.args)

    def run(*args):
        part_args = [None] * n  # (the frozen ones are constants of the part: not read)
        for j, p in zip(part.taken, taken):
            part_args[j] = args[p]
        res = part(*part_args)
        got = [res if k is None else res[k] for k in spec]
        return container(got) if container is not None else got[0]

    return run



def _example(arg, example_inputs, position):
    """The example value of a partition input: a parent placeholder's example, else the traced meta."""
    if arg in position:
        return example_inputs[position[arg]]
    val = arg.meta.get("val")
    import torch

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
