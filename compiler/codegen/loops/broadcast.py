"""Broadcast iteration spaces with as few loops as possible.

``merge_axes(out_shape, in_shapes)`` drops the output's size-1 axes and merges neighbouring axes
along which every operand moves alike (all of them, or the same ones), so that a broadcast of
[8, 16, 32] by [16, 32] is two loops, not three, and a plain elementwise op one. It returns the
merged sizes and, per operand, its element strides on them (0 where it broadcasts), for operands
stored dense row-major in their own shapes.
"""
from __future__ import annotations

import math
from typing import Sequence

from .expr import FormError


def merge_axes(out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    out = [int(d) for d in out_shape]
    rank = len(out)
    moves: list[list[bool]] = []  # per operand, per output axis: it moves along it
    for s in in_shapes:
        s = [int(d) for d in s]
        if len(s) > rank:
            raise FormError(f"operand shape {s} has more axes than the result {out}")
        padded = [1] * (rank - len(s)) + s
        row = []
        for axis, (i, o) in enumerate(zip(padded, out)):
            if i == o:
                row.append(o != 1)
            elif i == 1:
                row.append(False)
            else:
                raise FormError(f"operand shape {s} does not broadcast to {out} (axis {axis})")
        moves.append(row)
    groups: list[list[int]] = []
    for axis in (a for a in range(rank) if out[a] != 1):
        if groups and all(m[axis] == m[groups[-1][-1]] for m in moves):
            groups[-1].append(axis)
        else:
            groups.append([axis])
    sizes = [math.prod(out[a] for a in g) for g in groups] or [1]
    strides = []
    for m in moves:
        row, step = [], 1
        for g in reversed(groups):
            row.append(step if m[g[0]] else 0)
            if m[g[0]]:
                step *= math.prod(out[a] for a in g)
        strides.append(list(reversed(row)) or [0])
    return sizes, strides


def broadcast_strides(in_shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Element strides of a row-major tensor of ``in_shape`` read at the indices of ``out_shape``
    (right-aligned; 0 along the axes it broadcasts and those of size 1)."""
    out = [int(d) for d in out_shape]
    shape = [1] * (len(out) - len(in_shape)) + [int(d) for d in in_shape]
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step if d != 1 else 0)
        step *= d
    return tuple(reversed(strides))
