"""``torch.export`` programs to Kiln graphs: ``import_exported(ep)``; ``kiln compile model.pt2`` reads a
saved ``ExportedProgram`` (``torch.export.save``) through ``compiler.models.load_graph``.

The program is decomposed to core ATen (``run_decompositions``), its parameters, buffers and lifted
constants become Kiln constants (from ``state_dict`` and ``constants``, by the graph signature), its
user inputs the graph's inputs (shapes and dtypes from the traced metadata) and its user outputs the
graph's outputs; every node goes through the same lowering table as ``torch.compile``'s graphs. A
node without a lowering is refused with a ``ModelError`` naming it (there is no PyTorch to run it in).

A program exported with dynamic shapes (``dynamic_shapes={"x": {0: Dim("batch")}}``) keeps them: the
input's size is a symbolic dimension of the graph, named after the program's symbol (``s0``), and
``compiler.compile`` gives a ``Specializing`` executable (native code per size, compiled when a size is
first run), as for an ONNX model with a symbolic batch.
"""
from __future__ import annotations

from compiler.errors import ModelError
from compiler.ir.graph import Graph

from .importer import import_fx
from .lowerings import Unsupported


def import_exported(ep, name: str = "model") -> Graph:
    import torch
    from torch._decomp import core_aten_decompositions

    from .recurrent import ATEN_OPS

    table = core_aten_decompositions()
    for op in ATEN_OPS.values():  # recurrent layers kept whole: one Kiln op per layer, not a loop unrolled
        table.pop(op, None)
    ep = ep.run_decompositions(table)
    sig = ep.graph_signature
    owned = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    tensors = {**ep.state_dict, **ep.constants}
    examples, consts = [], {}
    for i, node in enumerate(n for n in ep.graph.nodes if n.op == "placeholder"):
        if node.name in owned:
            consts[i] = tensors[owned[node.name]]
            examples.append(consts[i])
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise ModelError(f"{name}: input {node.name} is not a tensor ({type(val).__name__})")
        examples.append(val)  # (its sizes: static, or the program's symbols, which stay symbolic)
    try:
        graph, _ = import_fx(ep.graph_module, examples, consts, name=name)
    except Unsupported as e:
        raise ModelError(f"{name}: {e} (a torch.export program runs wholly in Kiln: no PyTorch to run it in)") \
            from None
    graph.set_outputs(list(graph.outputs), [str(n) for n in sig.user_outputs])
    return graph


__all__ = ["import_exported"]
