"""``onnx.backend.base.Backend`` for Kiln, so ONNX's own backend test suite runs against it.

It imports with the ONNX frontend and runs with the whole compiler (``compiler.compile``), so it is a
tool on top of the driver, not part of ``frontends/`` (which the driver itself uses)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from frontends.onnx import import_model

from ..ir.graph import Graph
from ..ir.interpreter import interpret
from ..ir.types import OptionalType, SequenceType, TensorType
from ..passes.simplify.infer_shapes import shape_determining_inputs


class KilnRep(BackendRep):
    """A prepared model, compiled to native code on first run for the input shapes it is given (and
    again for other shapes; the last ``CACHE`` compiled models are kept). Integer inputs whose values
    decide shapes (a Reduce's axes, a Reshape's target shape fed as an input) are compiled in as
    constants, and a new value compiles again, as a new shape does. Nodes without native code run in the reference interpreter (with a
    ``FallbackWarning``) unless ``fallback=False``, which refuses them. ``interpret=True`` runs the
    whole imported graph in the reference interpreter instead (the oracle)."""

    CACHE = 16

    def __init__(self, model: onnx.ModelProto, opt_level: int = 2, fallback: bool = True, interpret: bool = False):
        self.model = model
        self.graph = import_model(model)  # fails early on unsupported ops, and gives the signature
        self.opt_level, self.fallback, self.interpret = opt_level, fallback, interpret
        self._compiled: dict[tuple, Any] = {}
        #: the executable of the last run (None when interpreted)
        self.executable = None

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
        if self.interpret:
            outs = interpret(self.graph, feeds)
            return tuple(outs[n] for n in self.graph.output_names)
        shapes = {k: tuple(v.shape) for k, v in feeds.items()
                  if isinstance(types.get(k), TensorType) and isinstance(v, np.ndarray)}
        values = {k: feeds[k] for k in shape_determining_inputs(self.graph, feeds)}
        key = (tuple(sorted(shapes.items())),
               tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in sorted(values.items())))
        exe = self._compiled.get(key)
        if exe is None:
            import compiler

            exe = compiler.compile(self.model, self.opt_level, shapes, fallback=self.fallback, input_values=values)
            if len(self._compiled) >= self.CACHE:
                self._compiled.pop(next(iter(self._compiled)))
            self._compiled[key] = exe
        self.executable = exe
        outs = exe.run({k: v for k, v in feeds.items() if k not in values})
        return tuple(outs[n] for n in exe.output_names)


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
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", opt_level: int = 2, fallback: bool = True,
                interpret: bool = False, **kwargs: Any) -> KilnRep:
        """Kiln's options: ``opt_level`` (0-3), ``fallback=False`` (strict: refuse nodes without
        native code), ``interpret=True`` (the reference interpreter, nothing compiled)."""
        super().prepare(model, device, **kwargs)
        return KilnRep(model, opt_level, fallback, interpret)

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
