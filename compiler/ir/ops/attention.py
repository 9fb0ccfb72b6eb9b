"""Attention ops: scaled dot-product Attention (MHA/GQA/MQA, masks, KV cache), RotaryEmbedding, SwiGLU,
LinearAttention (recurrent linear attention) and the preview-domain FlexAttention.

Narrow float inputs (f16, bf16) are computed in f32 and rounded to the input type where the ONNX
function body would produce a value of that type, so results agree with a graph of ONNX ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..types import DType, TensorType
from .base import STD_FLOATS, Cost, OpDef, Pattern, check_dtype
from .common import check_flags, compute_dtype

_SOFTMAX_PRECISIONS = frozenset({DType.f32, DType.f16, DType.f64, DType.bf16})
_I64 = frozenset({DType.i64})


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def _rounder(dtype: np.dtype, work: np.dtype):
    """A function that rounds a working-precision array to ``dtype`` (and back), or identity."""
    if np.dtype(dtype) == work:
        return lambda a: a
    return lambda a: a.astype(dtype).astype(work)


def _same_dim(op: OpDef, a, b, what: str):
    """Two dims that must agree: fail when both are static and differ; return the most specific."""
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise op.fail(f"{what}: {a} vs {b}")
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    return a if a == b else None


def _split_dim(op: OpDef, d, n: int, what: str):
    """``d / n`` for a packed (heads * size) dim; fail if static and not divisible."""
    if isinstance(d, int):
        if d % n:
            raise op.fail(f"{what} {d} is not divisible by the number of heads {n}")
        return d // n
    return None


def _mul(a, b):
    return a * b if isinstance(a, int) and isinstance(b, int) else None


def _add(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if a == 0:
        return b
    if b == 0:
        return a
    return None


def _softmax_rows(x: np.ndarray, rnd=lambda a: a) -> np.ndarray:
    """Softmax over the last axis; a row that is entirely -inf gives zeros (not NaN).

    ``rnd`` rounds each intermediate (x - max, exp, sum, quotient) to the precision the softmax is
    defined in, when that is narrower than x's working type.
    """
    m = np.max(x, axis=-1, keepdims=True)
    dead = np.isneginf(m)
    with np.errstate(invalid="ignore", over="ignore"):
        e = rnd(np.exp(rnd(x - np.where(dead, 0, m))))
    s = rnd(np.sum(e, axis=-1, keepdims=True))
    return np.where(dead, 0, rnd(e / np.where(dead, 1, s))).astype(x.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Attention(OpDef):
    """Scaled dot-product attention (ONNX Attention, opset 25 form).

    Q: (B, Hq, Sq, D) or (B, Sq, Hq*D) with ``q_num_heads``; K: (B, Hkv, Skv, D) or (B, Skv, Hkv*D);
    V: (B, Hkv, Skv, Dv) or (B, Skv, Hkv*Dv). ``Hq`` must be a multiple of ``Hkv`` (query head ``h`` uses
    K/V head ``h // (Hq/Hkv)``). ``past_key``/``past_value`` (B, Hkv, P, D/Dv) are concatenated before K/V
    (giving ``present_key``/``present_value``). The bias added to the scores is the sum of ``attn_mask``
    (bool: False -> -inf; float: added; a short last dim is padded with -inf), the causal frontier
    (key j visible to query i iff j <= i + offset), the ``nonpad_kv_seqlen`` padding (j < nonpad[b]) and
    the local window (offset + i - left <= j <= offset + i + right). ``offset`` is the past length, or
    ``nonpad_kv_seqlen[b] - Sq`` for an external cache, else 0. Fully masked rows produce zeros.
    Output 4 (``qk_matmul_output``) holds the scores per ``qk_matmul_output_mode``: 0 raw (scaled) QK,
    1 after softcap, 2 after the bias, 3 the softmax probabilities.
    """

    is_causal: int = 0
    kv_num_heads: int | None = None
    q_num_heads: int | None = None
    qk_matmul_output_mode: int = 0
    scale: float | None = None
    softcap: float = 0.0
    softmax_precision: DType | None = None
    left_window_size: int = -1
    right_window_size: int = -1

    since: ClassVar = 25
    inputs: ClassVar = ("Q", "K", "V", "attn_mask?", "past_key?", "past_value?", "nonpad_kv_seqlen?")
    outputs: ClassVar = ("Y", "present_key", "present_value", "qk_matmul_output")
    pattern: ClassVar = Pattern.OPAQUE

    def validate(self):
        check_flags(self, "is_causal")
        if self.qk_matmul_output_mode not in (0, 1, 2, 3):
            raise self.fail(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got {self.qk_matmul_output_mode}")
        for name in ("q_num_heads", "kv_num_heads"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise self.fail(f"{name} must be positive, got {v}")
        if self.q_num_heads is not None and self.kv_num_heads is not None and self.q_num_heads % self.kv_num_heads:
            raise self.fail(f"q_num_heads ({self.q_num_heads}) must be a multiple of kv_num_heads "
                            f"({self.kv_num_heads})")
        if self.softcap < 0:
            raise self.fail(f"softcap must be >= 0 (0 disables it), got {self.softcap}")
        if self.softmax_precision is not None and self.softmax_precision not in _SOFTMAX_PRECISIONS:
            raise self.fail(f"softmax_precision {self.softmax_precision} is not supported (supported: "
                            "1 (f32), 10 (f16), 11 (f64), 16 (bf16))")
        for name in ("left_window_size", "right_window_size"):
            if getattr(self, name) < -1:
                raise self.fail(f"{name} must be >= 0, or -1 for unbounded, got {getattr(self, name)}")

    # -- shapes ------------------------------------------------------------------------------
    def _heads(self, v, what: str, attr: str, heads: int | None):
        """(B, H, S, head_size) dims of a 3D or 4D operand."""
        if v.type.rank == 4:
            b, h, s, d = v.shape
            if heads is not None:
                h = _same_dim(self, h, heads, f"{what} has a head dimension that differs from {attr}")
            return b, h, s, d
        if heads is None:
            raise self.fail(f"{what} is 3D {v.type}: the {attr} attribute is required for 3D inputs")
        b, s, hidden = v.shape
        return b, heads, s, _split_dim(self, hidden, heads, f"{what} hidden size")

    def _dims(self, ins):
        q, k, v, mask, past_k, past_v, nonpad = (list(ins) + [None] * 7)[:7]
        for x, what in ((q, "Q"), (k, "K"), (v, "V")):
            if x.type.rank not in (3, 4):
                raise self.fail(f"{what} must be 3D or 4D, got {x.type}")
        if len({q.type.rank, k.type.rank, v.type.rank}) != 1:
            raise self.fail(f"Q, K and V must have the same rank (all 3D or all 4D), got {q.type}, {k.type}, "
                            f"{v.type}")
        t1 = check_dtype(self, q, STD_FLOATS, "Q")
        if k.dtype is not t1:
            raise self.fail(f"K has element type {k.dtype}, Q has {t1}: they must match")
        check_dtype(self, v, STD_FLOATS, "V")
        b, hq, sq, d = self._heads(q, "Q", "q_num_heads", self.q_num_heads)
        bk, hkv, skv, dk = self._heads(k, "K", "kv_num_heads", self.kv_num_heads)
        bv, hv, sv, dv = self._heads(v, "V", "kv_num_heads", self.kv_num_heads)
        b = _same_dim(self, _same_dim(self, b, bk, "Q and K batch sizes differ"), bv, "Q and V batch sizes differ")
        hkv = _same_dim(self, hkv, hv, "K and V head counts differ")
        skv = _same_dim(self, skv, sv, "K and V sequence lengths differ")
        d = _same_dim(self, d, dk, "Q and K head sizes differ")
        if isinstance(hq, int) and isinstance(hkv, int) and hq % hkv:
            raise self.fail(f"the number of query heads ({hq}) must be a multiple of the number of K/V heads "
                            f"({hkv})")
        if (past_k is None) != (past_v is None):
            raise self.fail("past_key and past_value must be given together")
        past = 0
        if past_k is not None:
            if nonpad is not None:
                raise self.fail("nonpad_kv_seqlen (external KV cache) cannot be combined with past_key/past_value")
            for x, what, hd in ((past_k, "past_key", d), (past_v, "past_value", dv)):
                if x.type.rank != 4:
                    raise self.fail(f"{what} must be 4D (batch, kv_num_heads, past_length, head_size), got {x.type}")
                _same_dim(self, x.shape[0], b, f"{what} batch size differs from Q's")
                _same_dim(self, x.shape[1], hkv, f"{what} head count differs from K's")
                _same_dim(self, x.shape[3], hd, f"{what} head size differs")
            if past_k.dtype is not k.dtype or past_v.dtype is not v.dtype:
                raise self.fail(f"past_key/past_value element types ({past_k.dtype}, {past_v.dtype}) must match "
                                f"K/V ({k.dtype}, {v.dtype})")
            past = _same_dim(self, past_k.shape[2], past_v.shape[2], "past_key and past_value lengths differ")
        total = _add(past, skv)
        if mask is not None:
            if mask.dtype is not DType.bool and mask.dtype not in STD_FLOATS:
                raise self.fail(f"attn_mask has element type {mask.dtype}; supported: bool (True = attend) or a "
                                "float type (added to the scores)")
            if not 1 <= mask.type.rank <= 4:
                raise self.fail(f"attn_mask must have rank 1 to 4, got {mask.type}")
            want = (b, hq, sq, total)[4 - mask.type.rank:]
            for i, (m, w) in enumerate(zip(mask.shape[:-1], want[:-1])):
                if isinstance(m, int) and isinstance(w, int) and m not in (1, w):
                    raise self.fail(f"attn_mask {mask.type} does not broadcast to (batch, q_heads, q_length, "
                                    f"total_length) = {(b, hq, sq, total)}")
            last = mask.shape[-1]
            if isinstance(last, int) and isinstance(total, int) and last > total:
                raise self.fail(f"attn_mask's last dimension {last} is longer than the total key length {total}")
        if nonpad is not None:
            check_dtype(self, nonpad, _I64, "nonpad_kv_seqlen")
            if nonpad.type.rank != 1:
                raise self.fail(f"nonpad_kv_seqlen must be 1D (batch_size,), got {nonpad.type}")
            _same_dim(self, nonpad.shape[0], b, "nonpad_kv_seqlen length differs from the batch size")
        return t1, b, hq, sq, d, hkv, skv, dv, past, total

    def infer(self, ins):
        q, k, v, _mask, past_k, past_v, _nonpad = (list(ins) + [None] * 7)[:7]
        t1, b, hq, sq, d, hkv, skv, dv, past, total = self._dims(ins)
        y = (b, hq, sq, dv) if q.type.rank == 4 else (b, sq, _mul(hq, dv))
        return [TensorType(t1, y), TensorType(k.dtype, (b, hkv, total, d)),
                TensorType(v.dtype, (b, hkv, total, dv)), TensorType(t1, (b, hq, sq, total))]

    # -- reference -----------------------------------------------------------------------------
    @staticmethod
    def _to4d(x: np.ndarray, heads: int | None) -> np.ndarray:
        if x.ndim == 4:
            return x
        b, s, hidden = x.shape
        return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)

    def compute(self, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
        t1, t2 = q.dtype, v.dtype
        rank = q.ndim
        q4 = self._to4d(q, self.q_num_heads)
        k4 = self._to4d(k, self.kv_num_heads)
        v4 = self._to4d(v, self.kv_num_heads)
        past = 0
        if past_key is not None:
            past = past_key.shape[2]
            k4 = np.concatenate([past_key, k4], axis=2)
            v4 = np.concatenate([past_value, v4], axis=2)
        present_k, present_v = np.ascontiguousarray(k4), np.ascontiguousarray(v4)
        b, hq, sq, d = q4.shape
        hkv, total = k4.shape[1], k4.shape[2]
        if hq % hkv:
            raise ValueError(f"query heads {hq} are not a multiple of K/V heads {hkv}")
        group = hq // hkv

        work = compute_dtype(t1, t2)
        r1 = _rounder(t1, work)
        scale = self.scale if self.scale is not None else 1.0 / np.sqrt(d)
        # the function body scales Q and K each by sqrt(scale), cast to Q's type
        root = np.sqrt(np.asarray(scale, dtype=np.float64)).astype(t1).astype(work)
        qs = r1(q4.astype(work) * root)
        ks = r1(k4.astype(work) * root)
        # query head h uses kv head h // group: view Q as (B, Hkv, group, Sq, D)
        scores = np.matmul(qs.reshape(b, hkv, group, sq, d), np.swapaxes(ks, -1, -2)[:, :, None])
        scores = r1(scores.reshape(b, hq, sq, total))
        qk = [scores]
        if self.softcap > 0:
            cap = np.asarray(self.softcap).astype(t1).astype(work)
            scores = r1(cap * r1(np.tanh(r1(scores / cap))))
        qk.append(scores)
        bias = self._bias(attn_mask, nonpad_kv_seqlen, b, sq, total, past, work)
        if bias is not None:
            scores = r1(scores + bias)
        qk.append(scores)
        if self.softmax_precision is not None:
            sp = self.softmax_precision.np
            sw = compute_dtype(sp)
            probs = _softmax_rows(scores.astype(sp).astype(sw), _rounder(sp, sw))
            probs = probs.astype(sp).astype(t1).astype(work)
        else:
            probs = _softmax_rows(scores, r1)
        qk.append(probs)
        y = np.matmul(probs.reshape(b, hkv, group, sq, total), v4.astype(work)[:, :, None])
        y = y.reshape(b, hq, sq, v4.shape[3]).astype(t1)
        if rank == 3:
            y = y.transpose(0, 2, 1, 3).reshape(b, sq, hq * v4.shape[3])
        return [np.ascontiguousarray(y), present_k, present_v, qk[self.qk_matmul_output_mode].astype(t1)]

    def _bias(self, mask, nonpad, b, sq, total, past, work):
        """The additive bias (broadcastable to (B, Hq, Sq, T)), or None when nothing is masked."""
        neg = work.type(-np.inf)
        bias = None
        if mask is not None:
            if mask.dtype == np.bool_:
                m = np.where(mask, work.type(0), neg)
            else:
                m = mask.astype(work)
            if m.shape[-1] < total:
                pad = [(0, 0)] * (m.ndim - 1) + [(0, total - m.shape[-1])]
                m = np.pad(m, pad, constant_values=neg)
            bias = m.reshape((1,) * (4 - m.ndim) + m.shape)
        structural = self.is_causal or nonpad is not None or self.left_window_size >= 0 or \
            self.right_window_size >= 0
        if structural:
            if nonpad is not None:
                lens = np.asarray(nonpad, dtype=np.int64).reshape(-1, 1, 1, 1)
                offset = lens - sq
            else:
                lens = None
                offset = np.full((1, 1, 1, 1), past, dtype=np.int64)
            i = np.arange(sq, dtype=np.int64).reshape(1, 1, sq, 1)
            j = np.arange(total, dtype=np.int64).reshape(1, 1, 1, total)
            pos = offset + i
            allowed = np.ones((offset.shape[0], 1, sq, total), dtype=bool)
            if lens is not None:
                allowed &= j < lens
            if self.is_causal:
                allowed &= j <= pos
            if self.left_window_size >= 0:
                allowed &= j >= pos - self.left_window_size
            if self.right_window_size >= 0:
                allowed &= j <= pos + self.right_window_size
            s = np.where(allowed, work.type(0), neg)
            bias = s if bias is None else bias + s
        return bias

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        q, k, v = ins[0], ins[1], ins[2]
        past = ins[4] if len(ins) > 4 else None
        if q.rank == 4:
            b, hq, sq, d = q.shape
        else:
            b, sq, hidden = q.shape
            hq = self.q_num_heads
            d = hidden // hq if isinstance(hidden, int) else None
        skv = k.shape[2] if k.rank == 4 else k.shape[1]
        total = _add(skv, past.shape[2] if past is not None else 0)
        if v.rank == 4:
            dv = v.shape[3]
        else:
            dv = v.shape[2] // self.kv_num_heads if isinstance(v.shape[2], int) else None
        dims = (b, hq, sq, d, total, dv)
        if not all(isinstance(x, int) for x in dims):
            return base
        n = b * hq * sq * total
        return Cost(2 * n * (d + dv) + 5 * n, base.bytes)


# ---------------------------------------------------------------------------------------------
# FlexAttention (ai.onnx.preview)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class FlexAttention(OpDef):
    """Attention over rank-4 Q (B, Hq, L, E), K (B, Hkv, S, E), V (B, Hkv, S, Ev) (ai.onnx.preview domain):
    Y = softmax((Q @ K^T) * scale) @ V, softmax in ``softmax_precision`` (default f32, f64 for f64 inputs).
    The ``score_mod``/``prob_mod`` subgraph attributes are not supported.
    """

    prob_mod: Any = None
    score_mod: Any = None
    scale: float | None = None
    softmax_precision: DType | None = None

    domain: ClassVar = "ai.onnx.preview"
    since: ClassVar = 1
    inputs: ClassVar = ("Q", "K", "V")
    outputs: ClassVar = ("Y",)

    def validate(self):
        if self.score_mod is not None or self.prob_mod is not None:
            raise self.fail("score_mod/prob_mod subgraph modifiers are not supported")
        if self.softmax_precision is not None and self.softmax_precision not in _SOFTMAX_PRECISIONS:
            raise self.fail(f"softmax_precision {self.softmax_precision} is not supported (supported: "
                            "1 (f32), 10 (f16), 11 (f64), 16 (bf16))")

    def infer(self, ins):
        q, k, v = ins
        for x, what in ((q, "Q"), (k, "K"), (v, "V")):
            if x.type.rank != 4:
                raise self.fail(f"{what} must be 4D, got {x.type}")
        t = check_dtype(self, q, STD_FLOATS, "Q")
        if k.dtype is not t or v.dtype is not t:
            raise self.fail(f"Q, K and V must share one element type, got {q.dtype}, {k.dtype}, {v.dtype}")
        b, hq, sq, d = q.shape
        b = _same_dim(self, _same_dim(self, b, k.shape[0], "Q and K batch sizes differ"), v.shape[0],
                      "Q and V batch sizes differ")
        hkv = _same_dim(self, k.shape[1], v.shape[1], "K and V head counts differ")
        _same_dim(self, k.shape[2], v.shape[2], "K and V sequence lengths differ")
        _same_dim(self, d, k.shape[3], "Q and K head sizes differ")
        if isinstance(hq, int) and isinstance(hkv, int) and hq % hkv:
            raise self.fail(f"the number of query heads ({hq}) must be a multiple of K/V heads ({hkv})")
        return [TensorType(t, (b, hq, sq, v.shape[3]))]

    def compute(self, q, k, v):
        t = q.dtype
        b, hq, sq, d = q.shape
        hkv, s = k.shape[1], k.shape[2]
        group = hq // hkv
        sp = self.softmax_precision.np if self.softmax_precision is not None else (
            np.dtype(np.float64) if t == np.float64 else np.dtype(np.float32))
        work = compute_dtype(t, sp)
        scale = self.scale if self.scale is not None else 1.0 / np.sqrt(d)
        scores = np.matmul(q.astype(work).reshape(b, hkv, group, sq, d),
                           np.swapaxes(k.astype(work), -1, -2)[:, :, None]).reshape(b, hq, sq, s)
        scores = (scores * work.type(scale)).astype(sp).astype(work)
        probs = _softmax_rows(scores).astype(sp).astype(work)
        y = np.matmul(probs.reshape(b, hkv, group, sq, s), v.astype(work)[:, :, None])
        return [y.reshape(b, hq, sq, v.shape[3]).astype(t)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        q, k, v = ins
        dims = (q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3])
        if not all(isinstance(x, int) for x in dims):
            return base
        b, h, l, s, e, ev = dims
        n = b * h * l * s
        return Cost(2 * n * (e + ev) + 5 * n, base.bytes)


# ---------------------------------------------------------------------------------------------
# RotaryEmbedding
# ---------------------------------------------------------------------------------------------

_ROPE_DTYPES = frozenset({DType.f32, DType.f16, DType.bf16})


@dataclass(frozen=True, eq=False)
class RotaryEmbedding(OpDef):
    """Rotary position embedding of X (B, H, S, D) or (B, S, H*D) with ``num_heads``.

    The first ``rotary_embedding_dim`` (default: all D) features of each head are rotated as pairs
    (x1, x2) -> (cos*x1 - sin*x2, sin*x1 + cos*x2); pairs are the two halves, or adjacent features when
    ``interleaved``. cos/sin come from the caches (max_pos, rot/2) indexed by ``position_ids`` (B, S), or
    are given per token (B, S, rot/2) when ``position_ids`` is absent.
    """

    interleaved: int = 0
    num_heads: int | None = None
    rotary_embedding_dim: int = 0

    since: ClassVar = 23
    inputs: ClassVar = ("X", "cos_cache", "sin_cache", "position_ids?")
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.OPAQUE

    def validate(self):
        check_flags(self, "interleaved")
        if self.num_heads is not None and self.num_heads <= 0:
            raise self.fail(f"num_heads must be positive, got {self.num_heads}")
        if self.rotary_embedding_dim < 0 or self.rotary_embedding_dim % 2:
            raise self.fail(f"rotary_embedding_dim must be an even number >= 0 (0 = the head size), got "
                            f"{self.rotary_embedding_dim}")

    def infer(self, ins):
        x, cos, sin, pos = (list(ins) + [None])[:4]
        t = check_dtype(self, x, _ROPE_DTYPES, "X")
        if cos.dtype is not t or sin.dtype is not t:
            raise self.fail(f"cos_cache/sin_cache element types ({cos.dtype}, {sin.dtype}) must match X ({t})")
        if x.type.rank == 4:
            b, h, s, d = x.shape
            if self.num_heads is not None:
                _same_dim(self, h, self.num_heads, "X's head dimension differs from num_heads")
        elif x.type.rank == 3:
            if self.num_heads is None:
                raise self.fail(f"X is 3D {x.type}: the num_heads attribute is required for 3D input")
            b, s, hidden = x.shape
            d = _split_dim(self, hidden, self.num_heads, "X hidden size")
        else:
            raise self.fail(f"X must be 3D (batch, seq, hidden) or 4D (batch, heads, seq, head_size), got {x.type}")
        rot = self.rotary_embedding_dim or d
        if isinstance(d, int):
            if rot > d:
                raise self.fail(f"rotary_embedding_dim {rot} is larger than the head size {d}")
            if rot % 2:
                raise self.fail(f"the head size {d} must be even")
        half = rot // 2 if isinstance(rot, int) else None
        want = 2 if pos is not None else 3
        for c, what in ((cos, "cos_cache"), (sin, "sin_cache")):
            if c.type.rank != want:
                layout = "(max_position, rotary_dim/2)" if pos is not None else "(batch, seq, rotary_dim/2)"
                raise self.fail(f"{what} must be {want}D {layout} "
                                f"{'with' if pos is not None else 'without'} position_ids, got {c.type}")
            _same_dim(self, c.shape[-1], half, f"{what}'s last dimension must be rotary_embedding_dim/2")
            if pos is None:
                _same_dim(self, c.shape[0], b, f"{what}'s batch dimension differs from X's")
                _same_dim(self, c.shape[1], s, f"{what}'s sequence dimension differs from X's")
        if pos is not None:
            check_dtype(self, pos, _I64, "position_ids")
            if pos.type.rank != 2:
                raise self.fail(f"position_ids must be 2D (batch, seq), got {pos.type}")
            _same_dim(self, pos.shape[0], b, "position_ids batch dimension differs from X's")
            _same_dim(self, pos.shape[1], s, "position_ids sequence dimension differs from X's")
        return [x.type]

    def compute(self, x, cos_cache, sin_cache, position_ids=None):
        t = x.dtype
        work = compute_dtype(t)
        if x.ndim == 4:
            x4 = x.transpose(0, 2, 1, 3)  # (B, S, H, D)
        else:
            b, s, hidden = x.shape
            x4 = x.reshape(b, s, self.num_heads, hidden // self.num_heads)
        x4 = x4.astype(work)
        d = x4.shape[-1]
        rot = self.rotary_embedding_dim or d
        if position_ids is not None:
            if position_ids.size and (position_ids.min() < 0 or position_ids.max() >= cos_cache.shape[0]):
                raise ValueError(f"position_ids must be in [0, {cos_cache.shape[0]}), got values in "
                                 f"[{position_ids.min()}, {position_ids.max()}]")
            cos, sin = cos_cache[position_ids], sin_cache[position_ids]
        else:
            cos, sin = cos_cache, sin_cache
        cos = cos.astype(work)[:, :, None, :]
        sin = sin.astype(work)[:, :, None, :]
        xr = x4[..., :rot]
        if self.interleaved:
            x1, x2 = xr[..., 0::2], xr[..., 1::2]
        else:
            x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
        real = cos * x1 - sin * x2
        imag = sin * x1 + cos * x2
        if self.interleaved:
            rotated = np.stack([real, imag], axis=-1).reshape(xr.shape)
        else:
            rotated = np.concatenate([real, imag], axis=-1)
        out = np.concatenate([rotated, x4[..., rot:]], axis=-1).astype(t)
        if x.ndim == 4:
            return [np.ascontiguousarray(out.transpose(0, 2, 1, 3))]
        return [out.reshape(x.shape)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        return Cost(3 * (outs[0].numel or 0), base.bytes)


# ---------------------------------------------------------------------------------------------
# SwiGLU
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class SwiGLU(OpDef):
    """Y = A * sigmoid(alpha * A) * B (A the gate, B the value; same shapes, no broadcasting)."""

    alpha: float = 1.0

    since: ClassVar = 28
    inputs: ClassVar = ("A", "B")
    outputs: ClassVar = ("Y",)
    pattern: ClassVar = Pattern.ELEMWISE

    def infer(self, ins):
        a, b = ins
        t = check_dtype(self, a, STD_FLOATS, "A")
        if b.dtype is not t:
            raise self.fail(f"A and B must share one element type, got {a.dtype} and {b.dtype}")
        if a.type.rank != b.type.rank:
            raise self.fail(f"A {a.type} and B {b.type} must have the same shape (no broadcasting)")
        shape = tuple(_same_dim(self, x, y, f"A {a.type} and B {b.type} must have the same shape "
                                               "(no broadcasting)") for x, y in zip(a.shape, b.shape))
        return [TensorType(t, tuple(x if x is not None else y for x, y in zip(shape, a.shape)))]

    def compute(self, a, b):
        work = compute_dtype(a.dtype)
        af = a.astype(work)
        with np.errstate(over="ignore"):
            y = af / (1 + np.exp(-work.type(self.alpha) * af)) * b.astype(work)
        return [y.astype(a.dtype)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        return Cost(12 * (outs[0].numel or 0), base.bytes)


# ---------------------------------------------------------------------------------------------
# LinearAttention
# ---------------------------------------------------------------------------------------------

_LA_DTYPES = frozenset({DType.f32, DType.f16, DType.bf16})
_UPDATE_RULES = ("linear", "gated", "delta", "gated_delta")


@dataclass(frozen=True, eq=False)
class LinearAttention(OpDef):
    """Recurrent linear attention over packed 3D inputs (ONNX LinearAttention, opset 27).

    query (B, T, Hq*dk), key (B, T, Hkv*dk), value (B, T, Hkv*dv); state S (B, Hkv, dk, dv) from
    ``past_state`` (default zeros). Per step, with g = decay (log-space; per key dim (B, T, Hkv*dk) or per
    head (B, T, Hkv)) and beta (B, T, Hkv) or (B, T, 1):
    linear S += k v^T; gated S = e^g S + k v^T; delta S += beta k (v - S^T k)^T;
    gated_delta S' = e^g S, S = S' + beta k (v - S'^T k)^T. The output o_t = scale * S_t^T q_t for each
    query head (head h reads state h // (Hq/Hkv)); outputs (B, T, Hq*dv) and the final state.
    """

    kv_num_heads: int
    q_num_heads: int
    chunk_size: int = 64
    scale: float = 0.0
    update_rule: str = "gated_delta"

    since: ClassVar = 27
    inputs: ClassVar = ("query", "key", "value", "past_state?", "decay?", "beta?")
    outputs: ClassVar = ("output", "present_state")
    pattern: ClassVar = Pattern.OPAQUE

    def validate(self):
        if self.q_num_heads <= 0 or self.kv_num_heads <= 0:
            raise self.fail(f"q_num_heads and kv_num_heads must be positive, got {self.q_num_heads}, "
                            f"{self.kv_num_heads}")
        if self.q_num_heads % self.kv_num_heads:
            raise self.fail(f"q_num_heads ({self.q_num_heads}) must be a multiple of kv_num_heads "
                            f"({self.kv_num_heads})")
        if self.update_rule not in _UPDATE_RULES:
            raise self.fail(f"update_rule {self.update_rule!r} is not supported (supported: "
                            f"{', '.join(_UPDATE_RULES)})")
        if self.chunk_size <= 0:
            raise self.fail(f"chunk_size must be positive, got {self.chunk_size}")

    def infer(self, ins):
        q, k, v, past, decay, beta = (list(ins) + [None] * 6)[:6]
        t = check_dtype(self, q, _LA_DTYPES, "query")
        for x, what in ((k, "key"), (v, "value"), (decay, "decay"), (beta, "beta")):
            if x is not None and x.dtype is not t:
                raise self.fail(f"{what} has element type {x.dtype}, query has {t}: they must match")
        for x, what in ((q, "query"), (k, "key"), (v, "value"), (decay, "decay"), (beta, "beta")):
            if x is not None and x.type.rank != 3:
                raise self.fail(f"{what} must be 3D packed (batch, seq, heads*size), got {x.type}")
        hq, hkv = self.q_num_heads, self.kv_num_heads
        b = q.shape[0]
        steps = q.shape[1]
        for x, what in ((k, "key"), (v, "value"), (decay, "decay"), (beta, "beta")):
            if x is not None:
                b = _same_dim(self, b, x.shape[0], f"{what} batch size differs from query's")
                steps = _same_dim(self, steps, x.shape[1], f"{what} sequence length differs from query's")
        dk = _split_dim(self, q.shape[2], hq, "query hidden size")
        dk = _same_dim(self, dk, _split_dim(self, k.shape[2], hkv, "key hidden size"),
                       "query and key head sizes differ")
        dv = _split_dim(self, v.shape[2], hkv, "value hidden size")
        if self.update_rule in ("gated", "gated_delta") and decay is None:
            raise self.fail(f"update_rule {self.update_rule!r} needs the decay input")
        if self.update_rule in ("delta", "gated_delta") and beta is None:
            raise self.fail(f"update_rule {self.update_rule!r} needs the beta input")
        if decay is not None and isinstance(decay.shape[2], int) and decay.shape[2] not in (hkv, _mul(hkv, dk)):
            raise self.fail(f"decay's last dimension must be kv_num_heads ({hkv}) or kv_num_heads*d_k, got "
                            f"{decay.type}")
        if beta is not None and isinstance(beta.shape[2], int) and beta.shape[2] not in (1, hkv):
            raise self.fail(f"beta's last dimension must be kv_num_heads ({hkv}) or 1, got {beta.type}")
        s_dtype = t
        if past is not None:
            s_dtype = check_dtype(self, past, _LA_DTYPES, "past_state")
            if past.type.rank != 4:
                raise self.fail(f"past_state must be 4D (batch, kv_num_heads, d_k, d_v), got {past.type}")
            for got, want, what in zip(past.shape, (b, hkv, dk, dv), ("batch", "kv_num_heads", "d_k", "d_v")):
                _same_dim(self, got, want, f"past_state {past.type} {what} dimension")
        return [TensorType(t, (b, steps, _mul(hq, dv))), TensorType(s_dtype, (b, hkv, dk, dv))]

    def compute(self, query, key, value, past_state=None, decay=None, beta=None):
        t = query.dtype
        s_dtype = past_state.dtype if past_state is not None else t
        work = np.dtype(np.float32) if t != np.float64 else np.dtype(np.float64)
        hq, hkv = self.q_num_heads, self.kv_num_heads
        b, steps, _ = query.shape
        dk = query.shape[2] // hq
        dv = value.shape[2] // hkv
        group = hq // hkv
        q = query.astype(work).reshape(b, steps, hkv, group, dk)
        k = key.astype(work).reshape(b, steps, hkv, dk)
        v = value.astype(work).reshape(b, steps, hkv, dv)
        state = (past_state.astype(work) if past_state is not None else np.zeros((b, hkv, dk, dv), work)).copy()
        gated = self.update_rule in ("gated", "gated_delta")
        delta = self.update_rule in ("delta", "gated_delta")
        if gated:
            g = np.exp(decay.astype(work))
            per_dim = g.shape[2] == hkv * dk
            g = g.reshape(b, steps, hkv, dk, 1) if per_dim else g.reshape(b, steps, hkv, 1, 1)
        if delta:
            bt = beta.astype(work)
            bt = np.broadcast_to(bt, (b, steps, hkv)).reshape(b, steps, hkv, 1)
        scale = work.type(self.scale if self.scale != 0.0 else 1.0 / np.sqrt(dk))
        out = np.empty((b, steps, hkv, group, dv), dtype=work)
        for i in range(steps):
            if gated:
                state = g[:, i] * state
            ki, vi = k[:, i], v[:, i]
            if delta:
                pred = np.einsum("bhkv,bhk->bhv", state, ki)
                vi = bt[:, i] * (vi - pred)
            state = state + ki[..., :, None] * vi[..., None, :]
            out[:, i] = np.einsum("bhgk,bhkv->bhgv", q[:, i], state) * scale
        return [out.reshape(b, steps, hq * dv).astype(t), state.astype(s_dtype)]

    def cost(self, ins, outs):
        base = super().cost(ins, outs)
        state = outs[1].numel if len(outs) > 1 else None
        steps = ins[0].shape[1]
        if state is None or not isinstance(steps, int):
            return base
        group = self.q_num_heads // self.kv_num_heads
        per_step = state * (4 + 2 * group + (4 if self.update_rule in ("delta", "gated_delta") else 0))
        return Cost(per_step * steps, base.bytes)


OPS = (Attention, FlexAttention, RotaryEmbedding, SwiGLU, LinearAttention)
