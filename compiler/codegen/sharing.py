"""Which kernels share one LLVM function, and emitting them (``emit_kernels``).

Many kernel groups of a model are the same code: the 20,000 Relus of a long chain, the layers of a
transformer (equal shapes, different weights), the repeated blocks of a CNN. Each distinct function
costs LLVM time (most of a compile), so a step whose kernel would be an earlier step's calls that
function with its own slots (buffer and weight addresses). Two tests find such steps:

* **equal keys** (``kernel_key``): a key that holds everything a lowering reads of its group
  except identities and names, so equal keys mean equal code without emitting anything (constants'
  contents are in the key, except those a lowering only reads through pointers:
  ``CONTENTS_FREE_ABOVE``);
* **equal code** (``_same_code``): groups whose keys differ only in the contents of constants of
  more than ``ALIKE_ABOVE`` elements (weights, biases, tables) are *alike*: the later one is
  emitted into a scratch module under a neutral name and shares the earlier function when the code
  (the function and its tasks, loop metadata compared by contents) is exactly the same. Its slots
  are its own, so its weights are its own (a lowering reads packed weights through weight slots);
  a lowering that compiles a constant into its code simply gives different code and its own
  function.

``build_program(verify_shared=True)`` checks the first kind on any model (the second is checked
by construction).
"""
from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from ..ir.graph import Value
from .kernels import KernelBuilder, KernelGroup, Services
from .llvm.elementwise import new_module, release_module
from .llvm.toolchain import CodegenError

if TYPE_CHECKING:
    from .program import Step

#: constants of more elements than this may differ between alike groups (code compared instead):
#: scalars, which lowerings often compile in, stay in the key
ALIKE_ABOVE = 1
#: the most earlier functions an alike group's code is compared with
ALIKE_TRIES = 4
#: the name an alike group's kernel is emitted under in its scratch module
_NEUTRAL = "kalike"


def emit_kernels(steps: list[Step], lowerings: dict[int, object], services: Services,
                 verify_shared: bool = False) -> None:
    """One LLVM function per distinct kernel (see the module docstring): a step equal to an earlier
    one calls its function with its own slots. Sets each native step's ``kernel``, ``slots``,
    ``scratch_bytes``, ``notes``."""
    shared: dict = {}    # kernel key -> (the step that made the function, id(value) -> canonical index)
    alike: dict = {}     # key blind to large constants -> the functions made for such groups
    codes: dict = {}     # function -> its code under the neutral name (made when first compared)
    digests: dict = {}
    for st in steps:
        if not st.native or st.alias:
            continue
        low = lowerings[st.index]
        key, canon = kernel_key(st.group, low, st.in_place, digests)
        if key is not None and key in shared:
            first, index = shared[key]
            slots = _map_slots(first.slots, index, canon)
            if slots is not None:
                if verify_shared:
                    _verify_shared(services, first, st, low, slots)
                st.kernel, st.slots, st.scratch_bytes = first.kernel, slots, first.scratch_bytes
                st.notes = list(first.notes)
                continue
        blind = kernel_key(st.group, low, st.in_place, digests, contents_above=ALIKE_ABOVE)[0]
        if blind is not None and blind in alike and _same_code(services, st, low, alike[blind], codes):
            continue
        name = f"k{st.index}_{'_'.join(st.group.ops)}"
        k = KernelBuilder(services, name, st.group)
        k.in_place = dict(st.in_place)
        low.emit(k, st.group)
        k.finish()
        st.kernel, st.slots, st.scratch_bytes, st.notes = name, k.slots, k.scratch_bytes, k.notes
        if key is not None:
            shared[key] = (st, {id(v): i for i, v in enumerate(canon)})
        if blind is not None:
            alike.setdefault(blind, []).append(name)


def _same_code(services: Services, st: Step, low, functions: list[str], codes: dict) -> bool:
    """Emit ``st``'s kernel into a scratch module and, if its code is one of ``functions``' (the
    first ``ALIKE_TRIES``), let ``st`` call that function with the slots it got there."""
    module = new_module("alike", services.target)
    k = KernelBuilder(Services(module, services.target, services.gemm_cfg), _NEUTRAL, st.group)
    k.in_place = dict(st.in_place)
    low.emit(k, st.group)
    k.finish()
    mine = _code(module, _NEUTRAL)
    release_module(module)
    for name in functions[:ALIKE_TRIES]:
        if name not in codes:
            codes[name] = _code(services.module, name)
        if codes[name] == mine:
            st.kernel, st.slots, st.scratch_bytes, st.notes = name, k.slots, k.scratch_bytes, k.notes
            return True
    return False


_MD_REF = re.compile(r"!(\d+)\b")


def _code(module, name: str) -> str:
    """The text of kernel ``name`` (its function, body and tasks) with the name made ``_NEUTRAL`` and
    each metadata reference replaced by the metadata's contents (numbers differ between modules)."""
    mds = {md.name: md for md in module.metadata}

    def contents(md, depth=0) -> str:
        ops = []
        for op in md.operands:
            if op is md:
                ops.append("self")
            elif isinstance(op, ir.values.MDValue) and depth < 8:
                ops.append(contents(op, depth + 1))
            else:
                ops.append(str(op))
        return "{" + ", ".join(ops) + "}"

    own = re.compile(r"(?<![-\w.$])" + re.escape(name) + r"(?![-\w$])")
    text = "\n".join(str(g) for n, g in module.globals.items() if n == name or n.startswith(name + "."))
    text = own.sub(_NEUTRAL, text)
    return _MD_REF.sub(lambda m: contents(mds[m.group(1)]) if m.group(1) in mds else m.group(0), text)


#: lowering -> the most elements a constant may hold for its contents to shape the code; a larger
#: constant is only read through its pointer at run time, so kernels that differ in such constants
#: alone share one function. Elementwise compiles in scalar constants only (``inlined`` in
#: ``kernels/elementwise.py``); ``tests/passes/test_large_graphs.py`` checks it. Lowerings not listed
#: share a function only where every constant is equal.
CONTENTS_FREE_ABOVE = {"Elementwise": 1}

class _NoKey(Exception):
    pass


def _digest(arr, cache: dict) -> tuple:
    """(dtype, shape, content hash) of a constant or known array (cached by identity)."""
    got = cache.get(id(arr))
    if got is None:
        a = np.asarray(arr)
        if a.dtype == object:
            raise _NoKey
        raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # the bytes, not copied
        # SHA-256, which CPUs with SHA extensions hash at about 2 GB/s (BLAKE2b here: 1 GB/s, and a
        # ``tobytes`` copy first): ResNet-50's weights 0.13 -> 0.06 s
        got = (a.dtype.str, a.shape, raw.tobytes() if raw.size <= 64 else hashlib.sha256(raw).digest())
        cache[id(arr)] = (got, arr)  # keep the array alive: its id must not be reused while cached
        return got
    return got[0]


def kernel_key(group: KernelGroup, lowering, in_place: dict, cache: dict | None = None,
               contents_above: int | None = None) -> tuple:
    """(a key that is equal for two groups exactly when a lowering emits the same function for them,
    the group's values in the key's order), or (None, None) when the group holds something the key
    cannot describe.

    A lowering sees only its group: the nodes (op and attributes), the values they read and write
    (types, constant and known contents, which node makes each, which read it inside the group and
    whether anything outside does), the group's inputs and results and the graph values they stand
    for, and the in-place pairs. The key holds all of it except identities and names (and the
    contents of constants a lowering only reads through pointers: ``CONTENTS_FREE_ABOVE``), with
    values numbered in the order met; slots of the first function then map to the other group's
    values by that number (``_map_slots``). ``build_program(verify_shared=True)`` checks the claim on any model.

    ``contents_above=n`` leaves out the contents of every constant of more than ``n`` elements (and of
    known values): the key of *alike* groups, whose code must then be compared."""
    cache = {} if cache is None else cache
    limit = CONTENTS_FREE_ABOVE.get(type(lowering).__name__) if contents_above is None else contents_above
    nodes = group.nodes
    at = {id(n): i for i, n in enumerate(nodes)}
    inside: dict[int, list] = {}
    for i, n in enumerate(nodes):
        for j, v in enumerate(n.inputs):
            if v is not None:
                inside.setdefault(id(v), []).append((i, j))
    index: dict[int, int] = {}
    values: list[Value] = []
    desc: list = []

    def ref(v: Value | None):
        if v is None:
            return None
        i = index.get(id(v))
        if i is None:
            i = index[id(v)] = len(values)
            values.append(v)
            uses = inside.get(id(v), ())
            p = v.producer
            c = v.const
            if c is None:
                contents = None
            elif limit is not None and c.size > limit:
                contents = ("pointer", c.dtype.str, c.shape)
            else:
                contents = _digest(c, cache)
            known = None if v.known is None or c is not None or limit is not None else _digest(v.known, cache)
            desc.append((v.type, contents, known,
                         (at[id(p)], v.index) if p is not None and id(p) in at else None,
                         tuple(uses), len(v.uses) > len(uses)))
        return i

    try:
        body = tuple((n.op.key(), tuple(ref(v) for v in n.inputs), tuple(ref(v) for v in n.outputs))
                     for n in nodes)
        ins = tuple(ref(v) for v in group.inputs)
        outs = tuple(ref(v) for v in group.outputs)
        outer = tuple(ref(group.outer_of(v)) for v in group.inputs + group.outputs)
        key = (type(lowering).__name__, tuple(sorted(in_place.items())), body, ins, outs, outer, tuple(desc))
        hash(key)
    except (_NoKey, TypeError):
        return None, None
    return key, values


def _verify_shared(services: Services, first: Step, st: Step, low, slots) -> None:
    """(``verify_shared``) Emit both steps' kernels under one name into modules of their own and
    check that the texts, the slots and the scratch are the same."""
    def emit(step: Step):
        module = new_module("check", services.target)
        k = KernelBuilder(Services(module, services.target, services.gemm_cfg), "kernel", step.group)
        k.in_place = dict(step.in_place)
        low.emit(k, step.group)
        k.finish()
        return str(module), k

    text_a, ka = emit(first)
    text_b, kb = emit(st)
    same_slots = len(kb.slots) == len(slots) and all(
        a.kind == b.kind and a.value is b.value and a.offset == b.offset and
        (a.array is None) == (b.array is None) and (a.array is None or np.array_equal(a.array, b.array))
        for a, b in zip(kb.slots, slots))
    if text_a != text_b or not same_slots or ka.scratch_bytes != kb.scratch_bytes:
        what = "code" if text_a != text_b else "slots" if not same_slots else "scratch"
        raise CodegenError(f"{st.group.describe()} (step {st.index}) would share the function of step {first.index}, "
                           f"but its {what} differs: kernel_key misses something the lowering {st.lowering} reads")


def _map_slots(slots, index: dict[int, int], canon: list[Value]):
    """The slots of a kernel for another group with the same key: each value slot takes the value with
    the same canonical number; weights (made from equal constants), scratch and status are the same."""
    from .kernels.base import Slot

    out = []
    for sl in slots:
        if sl.kind == "value":
            i = index.get(id(sl.value))
            if i is None:
                return None
            out.append(Slot("value", value=canon[i]))
        else:
            out.append(Slot(sl.kind, array=sl.array, offset=sl.offset))
    return out


__all__ = ["ALIKE_ABOVE", "CONTENTS_FREE_ABOVE", "emit_kernels", "kernel_key"]
