"""Shared pieces of the arch suite (``compiler.tools.archs``): the PyTorch import (optional), the
seeding and norm randomization every builder does (``_arch``), and the two hand-written norm layers
(ConvNeXt's ``LayerNorm2d``, Llama's ``RMSNorm``) that ``randomize_norms`` looks for."""
from __future__ import annotations

import functools
import types

import numpy as np

from ...errors import ModelError
from ..zoo import randomize_batchnorm

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:  # the arch classes are defined but unusable; export_arch says what is missing
    torch = F = None
    nn = types.SimpleNamespace(Module=object)

DEFAULT_OPSET = 17


def require_torch() -> None:
    if torch is None:
        raise ModelError("the archs are built with PyTorch, which is not installed (pip install torch, the CPU build)")


def _seed() -> np.random.Generator:
    torch.manual_seed(0)
    return np.random.default_rng(0)


def randomize_norms(module: nn.Module, seed: int = 0) -> None:
    """Non-trivial affine parameters for LayerNorm/GroupNorm (and RMSNorm weights, layer scales):
    freshly built they are 1 and 0, which would leave their multiply and add untested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in module.modules():
            if isinstance(mod, (nn.LayerNorm, nn.GroupNorm, RMSNorm, LayerNorm2d)):
                if getattr(mod, "weight", None) is not None:
                    mod.weight.copy_(torch.rand(mod.weight.shape, generator=g) + 0.5)
                if getattr(mod, "bias", None) is not None:
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)


def _arch(fn):
    """A ``build_<name>``: seeds, builds, randomizes the norms and puts the module in eval mode."""
    @functools.wraps(fn)
    def builder(batch: int = 1):
        require_torch()
        module, feeds, dynamic = fn(batch)
        randomize_batchnorm(module)
        randomize_norms(module)
        return module.eval(), feeds, dynamic
    return builder


def _images(rng, batch, res, channels=3):
    return rng.standard_normal((batch, channels, res, res)).astype(np.float32)


# -- hand-written norm layers (ConvNeXt's channels-first LayerNorm; Llama's RMSNorm) -------------

class LayerNorm2d(nn.Module):
    """ConvNeXt's channels_first LayerNorm, written out (mean and variance over the channel axis)."""

    def __init__(self, normalized_shape, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight
