"""A program's LLVM module, split into parts that compile side by side, one process each.

LLVM's optimizer and code generator take most of a compile (ResNet-50: 3.1 s of 4.6) and run on one
thread; llvmlite serializes its calls into LLVM behind one lock, so threads cannot share the work,
but processes can. ``split_module(text, parts)`` cuts the module's text into modules that compile
separately and link into the same library:

* every kernel (the functions and constants named ``kN_...`` and ``kN_....something``, which a
  kernel's lowering creates) goes whole into one part, the kernels balanced by text size; the
  forward functions and everything else defined with external linkage go into part 0;
* a definition another part refers to (a kernel called by the forward function) becomes ``hidden``
  (external, not exported from the library) and the other part declares it;
* helpers private to a module (``internal`` and ``linkonce_odr`` definitions that belong to no
  kernel: sizes taken at run time, shared by kernels) are copied into every part (LLVM drops those
  a part does not use; the linker keeps one ``linkonce_odr`` copy);
* declarations, metadata and the module header go into every part.

It returns None when the text has a shape it does not know (a constant referred to from another
kernel's part, an unparsed line): the module then compiles whole, as before. ``toolchain.compile_ir``
uses it for modules of ``SPLIT_MIN_CHARS`` or more (docs/codegen.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

#: the owner of a symbol: the kernel whose name it starts with (kernel names hold no '.')
_KERNEL = re.compile(r"^(k\d+_[^.]*)")
_SYMBOL = re.compile(r'@("(?:[^"\\]|\\.)*"|[-\w.$]+)')
_LOCAL_LINKAGE = ("internal", "private")


@dataclass
class _Def:
    """A top-level definition: a function (``define`` and its body) or a global variable."""

    name: str
    lines: list[str]
    is_function: bool
    linkage: str
    owner: str | None
    uses: set[str] = field(default_factory=set)

    @property
    def size(self) -> int:
        return sum(len(x) for x in self.lines)


def _name(token: str) -> str:
    return token[1:-1] if token.startswith('"') else token


def _linkage(words: list[str]) -> str:
    for w in words:
        if w in ("internal", "private", "linkonce_odr", "linkonce", "weak", "weak_odr", "external",
                 "available_externally", "common", "extern_weak"):
            return w
    return "external"


def _parse(text: str):
    """(header lines, declarations, definitions, metadata lines), or None for an unknown line."""
    header, decls, defs, meta = [], [], [], []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.startswith((";", "target ", "source_filename")):
            header.append(line)
        elif line.startswith("declare "):
            decls.append(line)
        elif line.startswith("!") or line.startswith("attributes #"):
            meta.append(line)
        elif line.startswith("@"):
            m = _SYMBOL.match(line)
            head = line.split("=", 1)[1].split() if "=" in line else []
            name = _name(m.group(1))
            defs.append(_Def(name, [line], False, _linkage(head[:3]), _owner(name),
                             {_name(t) for t in _SYMBOL.findall(line)[1:]}))
        elif line.startswith("define "):
            m = _SYMBOL.search(line)
            if m is None:
                return None
            body = [line]
            i += 1
            while i < len(lines) and lines[i] != "}":
                body.append(lines[i])
                i += 1
            if i == len(lines):
                return None
            body.append("}")
            name = _name(m.group(1))
            uses = {_name(t) for ln in body for t in _SYMBOL.findall(ln)} - {name}
            defs.append(_Def(name, body, True, _linkage(line[:m.start()].split()[1:]), _owner(name), uses))
        else:
            return None
        i += 1
    return header, decls, defs, meta


def _owner(name: str) -> str | None:
    m = _KERNEL.match(name)
    return m.group(1) if m else None


def _declaration(d: _Def) -> str:
    """``declare hidden`` for a function defined in another part (its header, less linkage, the
    attributes after the parameters and the body's brace)."""
    head = d.lines[0]
    at = _SYMBOL.search(head)
    words = head[:at.start()].split()[1:]
    ret = " ".join(w for w in words if w not in ("internal", "private", "hidden", "dso_local", "external"))
    depth, end = 0, None
    for j in range(at.end(), len(head)):
        if head[j] == "(":
            depth += 1
        elif head[j] == ")":
            depth -= 1
            if depth == 0:
                end = j + 1
                break
    if end is None:
        raise ValueError(f"no parameter list in {head!r}")
    return f"declare hidden {ret} {head[at.start():end]}"


def _hidden(line: str, linkage: str) -> str:
    """A definition's first line with its local linkage made ``hidden`` (external, not exported)."""
    return re.sub(rf"^(define|@\S+ =) {linkage} ", r"\1 hidden ", line, count=1)


def split_module(text: str, parts: int) -> list[str] | None:
    """The module ``text`` as ``parts`` modules (fewer when it has fewer kernels), or None (see the
    module docstring)."""
    parsed = _parse(text)
    if parsed is None or parts < 2:
        return None
    header, decls, defs, meta = parsed
    kernels: dict[str, list[_Def]] = {}
    shared: set[str] = set()
    outside: list[_Def] = []
    for d in defs:
        if d.owner is not None:
            kernels.setdefault(d.owner, []).append(d)
        elif d.linkage in _LOCAL_LINKAGE or d.linkage.startswith("linkonce"):
            shared.add(d.name)
        else:
            outside.append(d)
    parts = min(parts, len(kernels) + 1)
    if parts < 2:
        return None
    part_of: dict[str, int] = {d.name: 0 for d in outside}
    load = [sum(d.size for d in outside)] + [0] * (parts - 1)
    for owner, members in sorted(kernels.items(), key=lambda kv: -sum(d.size for d in kv[1])):
        p = min(range(parts), key=lambda q: load[q])
        load[p] += sum(d.size for d in members)
        for d in members:
            part_of[d.name] = p
    by_name = {d.name: d for d in defs}
    # what each part refers to that another part defines
    needed: list[set[str]] = [set() for _ in range(parts)]
    for d in defs:
        users = range(parts) if d.name not in part_of else (part_of[d.name],)
        for u in d.uses:
            if u in part_of:
                for p in users:
                    if part_of[u] != p:
                        needed[p].add(u)
    crossing = set().union(*needed)
    if any(not by_name[n].is_function for n in crossing):
        return None  # a constant used by two parts' kernels: not a shape the kernels make
    out = []
    for p in range(parts):
        lines = list(header) + list(decls)
        try:
            lines += [_declaration(by_name[n]) for n in sorted(needed[p])]
        except ValueError:  # a header it cannot read: compiled whole
            return None
        for d in defs:
            if d.name in shared:
                lines += d.lines
            elif part_of.get(d.name) == p:
                first = d.lines[0]
                if d.name in crossing and d.linkage in _LOCAL_LINKAGE:
                    first = _hidden(first, d.linkage)
                lines += [first] + d.lines[1:]
        lines += meta
        out.append("\n".join(lines) + "\n")
    return out


__all__ = ["split_module"]
