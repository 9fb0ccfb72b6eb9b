"""Real model architectures written out in PyTorch as their users write them (no torchvision), at
small sizes, for testing the whole path (export, import, -O2, native code) on what people run:
ResNet-18, MobileNetV3, EfficientNet-B0 (and ``efficientnet_b0_ceil_pool``: its head pooled by a
ceil-mode AvgPool whose window is larger than the input), ConvNeXt, RegNetY, ViT/DeiT, Swin, GPT-2,
Llama, a BERT-style encoder (``bert`` at opset 17, ``bert_opset11`` at opset 11, where LayerNorm is
written out), a U-Net, a YOLO-style detector head, LSTM/GRU/RNN sequence models and a wav2vec2-style
audio encoder.

``build_<name>(batch=1)`` returns ``(module, feeds, dynamic)``: the module in eval mode with seeded
weights (BatchNorm statistics and norm affine parameters randomized, so folding them is tested),
example inputs (numpy, ``batch`` rows) and the batch axis of every input and output as
``{name: [axis]}`` (the outputs are the names that are not inputs, in order). ``ARCHS`` maps each
name to its builder; ``export_arch(name)`` exports one to ONNX (``dynamo=False``, BatchNorm not
folded, like ``zoo.export``) with a symbolic batch::

    onnx_bytes, feeds, module = export_arch("resnet18")
    exe = compiler.compile(onnx.load_from_string(onnx_bytes), 2)   # the batch stays symbolic
    exe.run(feeds)                                                  # native code for this batch size

The sizes are test sizes (32-64 pixels, hidden 64-128, 16-32 tokens, a couple of blocks per
stage), not the published ones; the structure (blocks, normalizations, activations, attention,
how shapes are computed) is the published one.

The package: ``common`` (the optional PyTorch import, ``require_torch``, the seeding and norm
randomization every builder does, the hand-written ``LayerNorm2d``/``RMSNorm``), ``vision`` (the CNNs
and vision transformers: ResNet, MobileNetV3, EfficientNet, ConvNeXt, RegNet, ViT, Swin, U-Net,
YOLO), ``language`` (GPT-2, Llama, BERT, the LSTM/GRU/RNN models, wav2vec2) and this module (the
suite: ``ARCHS``, ``ARCH_OPSET``, ``build``, ``export_arch``, ``torch_outputs``), which re-exports
the builders, the model classes and the shared helpers, so ``archs.<name>`` works as before.
"""
from __future__ import annotations

import io
import warnings
from typing import Callable

import numpy as np

from ...errors import ModelError
from .common import DEFAULT_OPSET, LayerNorm2d, RMSNorm, nn, randomize_norms, require_torch, torch
from .language import (GPT2, BertModel, GRUClassifier, Llama, LSTMTagger, RNNRegressor, Wav2Vec2Encoder,
                       build_bert, build_gpt2, build_gru, build_llama, build_lstm, build_rnn, build_wav2vec2)
from .vision import (ConvNeXt, EfficientNet, MobileNetV3, RegNet, ResNet, SwinTransformer, UNet,
                     VisionTransformer, YoloDetector, build_convnext, build_efficientnet_b0,
                     build_efficientnet_b0_ceil_pool, build_mobilenetv3, build_regnet, build_resnet18,
                     build_swin, build_unet, build_vit, build_yolo)

__all__ = [
    "ARCHS", "ARCH_OPSET", "DEFAULT_OPSET", "build", "export_arch", "output_names", "torch_outputs",
    "require_torch", "randomize_norms", "LayerNorm2d", "RMSNorm",
    "ResNet", "MobileNetV3", "EfficientNet", "ConvNeXt", "RegNet", "VisionTransformer", "SwinTransformer",
    "UNet", "YoloDetector", "GPT2", "Llama", "BertModel", "LSTMTagger", "GRUClassifier", "RNNRegressor",
    "Wav2Vec2Encoder",
    "build_resnet18", "build_mobilenetv3", "build_efficientnet_b0", "build_efficientnet_b0_ceil_pool",
    "build_convnext", "build_regnet", "build_vit", "build_swin", "build_gpt2", "build_llama", "build_bert",
    "build_unet", "build_yolo", "build_lstm", "build_gru", "build_rnn", "build_wav2vec2",
]


# -- the suite -----------------------------------------------------------------------------------

ARCHS: dict[str, Callable] = {
    "resnet18": build_resnet18,
    "mobilenetv3": build_mobilenetv3,
    "efficientnet_b0": build_efficientnet_b0,
    "efficientnet_b0_ceil_pool": build_efficientnet_b0_ceil_pool,
    "convnext": build_convnext,
    "regnet": build_regnet,
    "vit": build_vit,
    "swin": build_swin,
    "gpt2": build_gpt2,
    "llama": build_llama,
    "bert": build_bert,
    "bert_opset11": build_bert,
    "unet": build_unet,
    "yolo": build_yolo,
    "lstm": build_lstm,
    "gru": build_gru,
    "rnn": build_rnn,
    "wav2vec2": build_wav2vec2,
}
#: the opset an arch is exported at when ``export_arch`` is not told (bert_opset11: LayerNormalization
#: is opset 17, so below it the exporter writes LayerNorm out as ReduceMean/Sub/Pow/Sqrt/Div)
ARCH_OPSET = {"bert_opset11": 11}


def build(name: str, batch: int = 1):
    """``(module in eval mode, feeds, dynamic axes)`` of the arch ``name`` (its ``build_<name>``)."""
    if name not in ARCHS:
        raise ModelError(f"unknown arch {name!r}; archs: {', '.join(ARCHS)}")
    return ARCHS[name](batch)


def output_names(feeds: dict, dynamic: dict) -> list[str]:
    return [n for n in dynamic if n not in feeds]


def export_arch(name: str, opset: int | None = None, dynamic_batch: bool = True, batch: int = 1):
    """``(onnx bytes, feeds, module)`` of an arch exported at ``opset`` (default 17, or the arch's
    own: ``ARCH_OPSET``) with the TorchScript exporter, nothing folded; with ``dynamic_batch`` the
    batch axis of every input and output is symbolic (``batch``)."""
    module, feeds, dynamic = build(name, batch)
    opset = opset if opset is not None else ARCH_OPSET.get(name, DEFAULT_OPSET)
    axes = {n: {a: "batch" for a in ax} for n, ax in dynamic.items()} if dynamic_batch else None
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(torch.from_numpy(v) for v in feeds.values()), f, dynamo=False,
                          opset_version=opset, do_constant_folding=False, input_names=list(feeds),
                          output_names=output_names(feeds, dynamic), dynamic_axes=axes)
    return f.getvalue(), feeds, module


def torch_outputs(module: nn.Module, feeds: dict) -> list[np.ndarray]:
    """The module's outputs on ``feeds`` (in order), as numpy."""
    with torch.no_grad():
        out = module(*[torch.from_numpy(v) for v in feeds.values()])
    return [t.numpy() for t in (out if isinstance(out, (tuple, list)) else (out,))]
