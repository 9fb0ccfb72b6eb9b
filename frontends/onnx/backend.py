"""``onnx.backend.base.Backend`` for Kiln, so ONNX's own backend test suite runs against it."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from compiler.ir.graph import Graph
from compiler.ir.interpreter import interpret
from compiler.ir.types import OptionalType, SequenceType

from .importer import import_model


class KilnRep(BackendRep):
    """A prepared model: the imported graph, run with the reference interpreter."""

    def __init__(self, graph: Graph):
        self.graph = graph

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Tensors are arrays; a sequence is a list of arrays, an optional its value or None."""
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray) or not isinstance(inputs, Sequence):
                inputs = [inputs]
            names = [v.name for v in self.graph.inputs]
            feeds = dict(zip(names, inputs))
        types = {v.name: v.type for v in self.graph.inputs}
        feeds = {k: _feed(v, types.get(k)) for k, v in feeds.items()}
        outs = interpret(self.graph, feeds)
        return tuple(outs[n] for n in self.graph.output_names)


def _feed(v: Any, t: Any) -> Any:
    if isinstance(t, OptionalType):
        if v is None:
            return None  # an empty optional
        t = t.elem
    if isinstance(t, SequenceType) and isinstance(v, (list, tuple)):
        return [np.asarray(x) for x in v]
    return np.asarray(v)


class KilnBackend(Backend):
    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> KilnRep:
        super().prepare(model, device, **kwargs)
        return KilnRep(import_model(model))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper().startswith("CPU")


prepare = KilnBackend.prepare
run_model = KilnBackend.run_model
supports_device = KilnBackend.supports_device
is_compatible = KilnBackend.is_compatible
