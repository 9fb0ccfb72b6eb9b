"""Finding and loading models named on the command line or in the API (``compiler.compile`` loads
its model here, so this is part of the compiler's core, under the driver).

A model is an ONNX file (``.onnx``) or ModelProto, a Kiln IR text file (``.kir``, with its
``.kir.npz`` weights), a Graph, or ``light:NAME``: one of the ONNX model-zoo networks that the
``onnx`` package ships (``onnx/backend/test/data/light/light_NAME.onnx``: bvlc_alexnet, densenet121,
inception_v1, inception_v2, resnet50, shufflenet, squeezenet, vgg19, zfnet512).

``zoo:NAME[?key=value,...]`` models are built with PyTorch by the tools (``compiler/tools/zoo.py``:
``zoo.model_of(spec)`` is the ONNX model to pass here); the ``kiln`` command accepts them too.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence

from .errors import ModelError
from .ir.graph import Graph


def light_model_dir() -> str:
    """Where the onnx package keeps its light model-zoo networks (found without importing onnx,
    which takes a second)."""
    import importlib.util

    spec = importlib.util.find_spec("onnx")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("light: models come with the onnx package, which is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "backend", "test", "data", "light")


def light_models() -> list[str]:
    d = light_model_dir()
    return sorted(f[len("light_"):-len(".onnx")] for f in os.listdir(d) if f.endswith(".onnx"))


def resolve(spec: str) -> str:
    """The file a model spec names (``light:NAME`` or a path)."""
    if spec.startswith("light:"):
        name = spec[len("light:"):]
        path = os.path.join(light_model_dir(), f"light_{name}.onnx")
        if not os.path.exists(path):
            raise ModelError(f"no light model {name!r}; the onnx package ships: {', '.join(light_models())}")
        return path
    if not os.path.exists(spec):
        raise ModelError(f"no such model file: {spec}")
    return spec


def load_graph(spec, input_shapes: Mapping[str, Sequence] | None = None) -> Graph:
    """A graph from a model spec, path, ModelProto or Graph."""
    if isinstance(spec, Graph):
        return spec
    if isinstance(spec, str) and spec.startswith("zoo:"):
        raise ModelError(f"{spec}: zoo: models are built with PyTorch by the tools, not loaded here; pass "
                         f"compiler.tools.zoo.model_of({spec!r}) (its ONNX model) instead")
    if isinstance(spec, str):
        path = resolve(spec)
        if path.endswith(".kir"):
            from .ir.parser import load_text
            from .ir.verify import VerifyError, verify

            g = load_text(path)  # a ParseError (a KilnError) for text that is not Kiln IR
            if input_shapes:
                raise ModelError("--input-shape applies to ONNX models; a .kir file has its shapes")
            try:
                verify(g)  # a malformed graph in a file is the file's fault, not a compiler bug
            except VerifyError as e:
                raise ModelError(f"{path}: {e}") from None
            return g
        if path.endswith(".pt2"):
            return _load_exported(path, input_shapes)
        spec = path
    from frontends.onnx import import_model

    return import_model(spec, input_shapes=input_shapes)


def _load_exported(path: str, input_shapes) -> Graph:
    """A saved ``torch.export`` program (``torch.export.save``), through ``frontends.torch``."""
    import warnings

    if input_shapes:
        raise ModelError("--input-shape applies to ONNX models; a .pt2 program has its shapes")
    try:
        import torch
    except ImportError:
        raise ModelError(f"{path}: a .pt2 file is a torch.export program; reading it needs PyTorch "
                         f"(pip install torch, the CPU build)") from None
    from frontends.torch import import_exported

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # (PyTorch's own deprecations while reading)
            ep = torch.export.load(path)
    except Exception as e:  # a file that is not a saved ExportedProgram
        raise ModelError(f"{path}: not a saved torch.export program: {type(e).__name__}: {e}") from None
    return import_exported(ep, name=os.path.splitext(os.path.basename(path))[0])
