"""ONNX converters for the attention op family (older opset forms rewritten into the IR form).

None are needed: Attention-23 and -24 differ from the IR's opset-25 form only by trailing optional
parts whose absence means the same (input ``nonpad_kv_seqlen`` from 24; ``left_window_size`` /
``right_window_size`` from 25, default -1 = unbounded), and the 23/24 errata (zero rows for fully
masked queries, bottom-right causal alignment) are in-place corrections the IR follows. RotaryEmbedding,
SwiGLU and LinearAttention each have a single form.
"""
from __future__ import annotations

CONVERTERS: dict = {}
