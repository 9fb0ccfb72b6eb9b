"""Models Kiln builds itself with PyTorch (no torchvision): an MLP, a BERT-style encoder, a
MobileNetV2-style CNN and an EfficientNet-style block. Used by the tests, ``kiln bench`` and
``benchmarks/``.

``export(name, **size)`` returns (onnx bytes, example inputs as numpy, the torch module);
``model_of(spec)`` the ONNX model of a spec, for ``compiler.compile`` (the compiler's core does not
know ``zoo:`` specs: the ``kiln`` commands resolve them here).

Model specs (``kiln bench zoo:bert``, ``load("zoo:mlp?batch=64")``)::

    zoo:NAME                        default sizes
    zoo:NAME?KEY=VALUE,KEY=VALUE    sizes changed (``&`` also separates; quote it in a shell)

    zoo:mlp?batch=64                zoo:mlp?sizes=784x256x10
    zoo:bert?seq=128,layers=2       zoo:mobilenetv2?resolution=224,width=0.5
    zoo:efficientnet_block?resolution=64

A value is an integer, a float, or integers joined by ``x`` (a tuple). ``opset=N`` picks the ONNX
opset of the export (default 17) for every model. ``PARAMS`` lists each model's keys and defaults.

PyTorch is needed to build these models; without it the module still imports and ``load``/``export``
raise a ``ModelError`` that says so.
"""
from __future__ import annotations

import io
import math
import types
from typing import NamedTuple

import numpy as np

from ..errors import ModelError

try:
    import torch
    from torch import nn
except ImportError:  # the classes below are defined but unusable; build() says what is missing
    torch = None
    nn = types.SimpleNamespace(Module=object)

# model -> {key: default}: the sizes a spec may set (besides ``opset``)
PARAMS: dict[str, dict] = {
    "mlp": {"batch": 1, "sizes": (784, 512, 512, 10)},
    "bert": {"batch": 1, "seq": 128, "vocab": 1000, "hidden": 256, "heads": 4, "layers": 4},
    "mobilenetv2": {"resolution": 224, "width": 1.0, "classes": 1000},
    "efficientnet_block": {"resolution": 64, "cin": 16, "cout": 24, "expand": 4, "blocks": 2},
    "resnet": {"resolution": 224, "layers": (3, 4, 6, 3), "width": 64, "classes": 1000},
}
DEFAULT_OPSET = 17


def require_torch() -> None:
    if torch is None:
        raise ModelError("zoo: models are built with PyTorch, which is not installed "
                         "(pip install torch, the CPU build)")


class MLP(nn.Module):
    def __init__(self, sizes=(784, 512, 512, 10)):
        super().__init__()
        layers = []
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class SelfAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.d = heads, hidden // heads
        self.q, self.k, self.v = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x, mask):
        b, s, h = x.shape
        def split(t):
            return t.view(b, s, self.heads, self.d).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d) + mask
        ctx = torch.softmax(scores, dim=-1) @ v
        return self.out(ctx.transpose(1, 2).reshape(b, s, h))


class EncoderLayer(nn.Module):
    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.attn = SelfAttention(hidden, heads)
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.ff1, self.ff2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x, mask):
        x = self.ln1(x + self.attn(x, mask))
        return self.ln2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))


class BertEncoder(nn.Module):
    """Embeddings + post-LayerNorm transformer encoder layers, BERT-style."""

    def __init__(self, vocab=1000, hidden=256, heads=4, layers=4, seq=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.randn(1, seq, hidden) * 0.02)
        self.ln = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, 4 * hidden) for _ in range(layers))

    def forward(self, ids, attention_mask):
        x = self.ln(self.tok(ids) + self.pos)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x


def conv_bn(cin, cout, k, stride=1, groups=1, act=...):
    if act is ...:
        act = nn.ReLU6
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        mid = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = [conv_bn(cin, mid, 1)] if expand != 1 else []
        layers += [conv_bn(mid, mid, 3, stride, groups=mid), conv_bn(mid, cout, 1, act=None)]
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.block(x) if self.use_res else self.block(x)


class MobileNetV2(nn.Module):
    """MobileNetV2 (Sandler et al. 2018): depthwise separable inverted residuals with ReLU6."""

    CONFIG = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
              (6, 320, 1, 1)]

    def __init__(self, width=1.0, classes=1000):
        super().__init__()
        c = lambda n: max(8, int(n * width + 4) // 8 * 8)  # noqa: E731
        layers, cin = [conv_bn(3, c(32), 3, 2)], c(32)
        for t, ch, n, s in self.CONFIG:
            for i in range(n):
                layers.append(InvertedResidual(cin, c(ch), s if i == 0 else 1, t))
                cin = c(ch)
        layers.append(conv_bn(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class SqueezeExcite(nn.Module):
    def __init__(self, ch, reduced):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(ch, reduced, 1), nn.Conv2d(reduced, ch, 1)

    def forward(self, x):
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(s))))


class EfficientNetBlock(nn.Module):
    """An MBConv stage: expand (SiLU) → depthwise (SiLU) → squeeze-excite → project, + HardSwish head."""

    def __init__(self, cin=16, cout=24, expand=4, blocks=2):
        super().__init__()
        self.stem = conv_bn(3, cin, 3, 2, act=nn.Hardswish)
        body, c = [], cin
        for i in range(blocks):
            mid = c * expand
            body.append(nn.Sequential(conv_bn(c, mid, 1, act=nn.SiLU),
                                      conv_bn(mid, mid, 3, 2 if i == 0 else 1, groups=mid, act=nn.SiLU),
                                      SqueezeExcite(mid, max(1, c // 4)), conv_bn(mid, cout, 1, act=None)))
            c = cout
        self.body = nn.Sequential(*body)
        self.head = nn.Sequential(nn.Conv2d(cout, 64, 1), nn.Hardswish())

    def forward(self, x):
        return self.head(self.body(self.stem(x)))


class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1x1 reduce, 3x3 (the stride), 1x1 expand (x4), plus the shortcut."""

    def __init__(self, cin, mid, stride):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, mid, 1, act=nn.ReLU), conv_bn(mid, mid, 3, stride, act=nn.ReLU),
                                  conv_bn(mid, mid * 4, 1, act=None))
        self.short = conv_bn(cin, mid * 4, 1, stride, act=None) if stride != 1 or cin != mid * 4 else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


class ResNet(nn.Module):
    """ResNet (He et al. 2016) with bottleneck blocks: ``layers=(3, 4, 6, 3)`` is ResNet-50."""

    def __init__(self, layers=(3, 4, 6, 3), width=64, classes=1000):
        super().__init__()
        stem = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        blocks, cin = [], width
        for i, n in enumerate(layers):
            mid = width * 2 ** i
            for j in range(n):
                blocks.append(Bottleneck(cin, mid, 2 if j == 0 and i > 0 else 1))
                cin = mid * 4
        self.features = nn.Sequential(*stem, *blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def build(name: str, **size):
    """(module, example inputs as numpy arrays, input names)."""
    require_torch()
    if name not in PARAMS:
        raise ModelError(f"unknown zoo model {name!r}; models: {', '.join(PARAMS)}")
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if name == "mlp":
        batch = size.pop("batch", 1)
        m = MLP(**size)
        return m, [rng.standard_normal((batch, m.net[0].in_features)).astype(np.float32)], ["x"]
    if name == "bert":
        seq = size.get("seq", 128)
        batch = size.pop("batch", 1)
        m = BertEncoder(**size)
        ids = rng.integers(0, m.tok.num_embeddings, (batch, seq)).astype(np.int64)
        mask = np.ones((batch, seq), np.int64)
        mask[:, seq * 3 // 4:] = 0
        return m, [ids, mask], ["input_ids", "attention_mask"]
    if name == "mobilenetv2":
        res = size.pop("resolution", 224)
        m = MobileNetV2(**size)
        return m, [rng.standard_normal((1, 3, res, res)).astype(np.float32)], ["x"]
    if name == "resnet":
        res = size.pop("resolution", 224)
        m = ResNet(**size)
        return m, [rng.standard_normal((1, 3, res, res)).astype(np.float32)], ["x"]
    if name == "efficientnet_block":
        res = size.pop("resolution", 64)
        m = EfficientNetBlock(**size)
        return m, [rng.standard_normal((1, 3, res, res)).astype(np.float32)], ["x"]
    raise ModelError(f"unknown zoo model {name!r}; models: {', '.join(PARAMS)}")


def randomize_batchnorm(module: nn.Module, seed: int = 0) -> None:
    """Give BatchNorm layers non-trivial statistics, so folding them is really tested."""
    g = torch.Generator().manual_seed(seed)
    for mod in module.modules():
        if isinstance(mod, nn.BatchNorm2d):
            n = mod.num_features
            mod.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            mod.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.5)
            mod.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
            mod.bias.data.copy_(torch.randn(n, generator=g) * 0.1)


def export(name: str, opset: int = 17, fold: bool = False, dynamic_batch: bool = False, **size):
    """ONNX bytes of a zoo model (eval mode), its example inputs and the torch module.

    ``fold=False`` keeps the graph as written (BatchNormalization, shape arithmetic), so Kiln's own
    passes do the simplifying; PyTorch's exporter would otherwise fold BatchNorm into Conv itself.
    ``dynamic_batch=True`` exports the first dimension of every input and the output as symbolic
    (``N``), as ``dynamic_axes`` does for users.
    """
    m, inputs, names = build(name, **size)
    randomize_batchnorm(m)
    m.eval()
    f = io.BytesIO()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, tuple(torch.from_numpy(x) for x in inputs), f, dynamo=False, opset_version=opset,
                          do_constant_folding=fold, input_names=names, output_names=["output"],
                          dynamic_axes={n: {0: "N"} for n in [*names, "output"]} if dynamic_batch else None)
    return f.getvalue(), dict(zip(names, inputs)), m


def torch_reference(module: nn.Module, feeds: dict) -> np.ndarray:
    with torch.no_grad():
        return module(*[torch.from_numpy(v) for v in feeds.values()]).numpy()


# -- model specs ---------------------------------------------------------------------------------

class ZooModel(NamedTuple):
    """What ``load`` returns; unpacks as ``proto, feeds, module = load(spec)``."""

    onnx: "object"  # onnx.ModelProto
    feeds: dict  # input name -> example numpy array
    module: "object"  # the torch.nn.Module (eval mode)


def _value(key: str, text: str, spec: str):
    try:
        if "x" in text:
            return tuple(int(t) for t in text.split("x"))
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise ModelError(f"{spec}: {key}={text!r} is not a number (or numbers joined by x, like 784x512x10)") from None


def parse_spec(spec: str) -> tuple[str, dict]:
    """``zoo:NAME?KEY=VALUE,...`` -> (NAME, {key: value}); checks NAME and the keys. ``opset`` is a key."""
    if not spec.startswith("zoo:"):
        raise ModelError(f"not a zoo model spec: {spec!r} (expected zoo:NAME or zoo:NAME?KEY=VALUE,...)")
    body = spec[len("zoo:"):]
    name, _, query = body.partition("?")
    if name not in PARAMS:
        raise ModelError(f"no zoo model {name!r}; zoo models: {', '.join(PARAMS)} "
                         f"(e.g. zoo:bert, zoo:mlp?batch=64)")
    params: dict = {}
    for item in query.replace("&", ",").split(",") if query else []:
        if not item:
            continue
        key, eq, text = item.partition("=")
        if not eq or not text:
            raise ModelError(f"{spec}: expected KEY=VALUE, got {item!r}")
        allowed = dict(PARAMS[name], opset=DEFAULT_OPSET)
        if key not in allowed:
            keys = ", ".join(f"{k} (default {_show(v)})" for k, v in allowed.items())
            raise ModelError(f"{spec}: zoo:{name} has no size {key!r}; it takes {keys}")
        v = _value(key, text, spec)
        if isinstance(allowed[key], tuple) and not isinstance(v, tuple):
            v = (v,)
        elif isinstance(allowed[key], int) and not isinstance(v, int):
            raise ModelError(f"{spec}: {key} must be an integer, got {text!r}")
        params[key] = v
    return name, params


def _show(v) -> str:
    return "x".join(map(str, v)) if isinstance(v, tuple) else str(v)


def canonical(spec: str) -> str:
    """The spec with its keys sorted and defaults dropped (``zoo:mlp?batch=1`` -> ``zoo:mlp``)."""
    name, params = parse_spec(spec)
    defaults = dict(PARAMS[name], opset=DEFAULT_OPSET)
    kept = {k: v for k, v in sorted(params.items()) if v != defaults[k]}
    return f"zoo:{name}" + ("?" + ",".join(f"{k}={_show(v)}" for k, v in kept.items()) if kept else "")


def load(spec: str) -> ZooModel:
    """Build and export the model a ``zoo:`` spec names: (onnx.ModelProto, example feeds, torch module).

    The weights are seeded, so two calls give the same model. Raises ``ModelError`` for an unknown
    model or size, or when PyTorch is missing.
    """
    import onnx

    name, params = parse_spec(spec)
    require_torch()
    opset = params.pop("opset", DEFAULT_OPSET)
    data, feeds, module = export(name, opset=opset, **params)
    return ZooModel(onnx.load_from_string(data), feeds, module)


def model_of(spec):
    """The model ``compiler.compile`` and ``models.load_graph`` take for ``spec``: a ``zoo:`` spec's
    ONNX model (built here), anything else (a path, ``light:NAME``, a ModelProto or Graph) unchanged."""
    if isinstance(spec, str) and spec.startswith("zoo:"):
        return load(spec).onnx
    return spec
