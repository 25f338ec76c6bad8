"""Reads a compiled step's optimized HLO for what would make its cost follow the pools' size.

A step that updates a pool in place costs what it touches. XLA can still copy a whole pool
leaf inside the step — when a read of the old pool is not ordered before the in-place write
(copy insertion then keeps the old buffer alive by copying it), or when a write is duplicated
into two fusions — and donation alone does not show it: the output still aliases the input.
`pool_copies` finds those copies in the compiled text; the test of every step at every bucket
(tests/model/test_in_place.py) and `ninfer bench engine`'s capacity ratio rest on it.

`pool_converts` finds a pool leaf converted whole (XLA's CPU bfloat16 scatter).

`whole_weight_converts` finds the other per-step cost that does not follow the work: a weight
of a narrow dtype (bfloat16) converted whole to float32 inside the step, which XLA's CPU
backend does around any dot it cannot run in that dtype (tests/model/test_model_dtype_weights.py).
"""
from __future__ import annotations

import math
import re
from typing import Iterable

# `%copy.3 = f32[32,64,2,16]{3,2,1,0} copy(%p)` and the async pair's start.
_COPY = re.compile(r"%[\w.\-]+ = (\w+)\[([\d,]*)\]\S* (?:copy|copy-start)\(")

_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "s32": "int32", "u8": "uint8",
           "f64": "float64", "s8": "int8", "f8e4m3fn": "float8_e4m3fn"}


def leaf_signature(shape: Iterable[int], dtype) -> tuple[str, int]:
    """(dtype name, element count): how a pool leaf is recognised in the HLO, whatever reshape
    (a KV leaf `[pages, 64, Hkv, D]` is often copied as `[pages*64, Hkv, D]`)."""
    import numpy as np

    return np.dtype(dtype).name, math.prod(int(d) for d in shape)


def pool_copies(hlo_text: str, pool_leaves: Iterable[tuple[Iterable[int], object]]) -> list[str]:
    """The copy instructions of `hlo_text` (an executable's `as_text()`) with as many elements
    of the same dtype as one of `pool_leaves` ((shape, dtype) pairs): each one copies a whole
    pool leaf."""
    wanted = {leaf_signature(shape, dtype) for shape, dtype in pool_leaves}
    found = []
    for m in _COPY.finditer(hlo_text):
        dtype = _DTYPES.get(m.group(1), m.group(1))
        dims = [int(d) for d in m.group(2).split(",") if d]
        if (dtype, math.prod(dims)) in wanted:
            line_end = hlo_text.find("\n", m.start())
            found.append(hlo_text[m.start():line_end if line_end >= 0 else None].strip()[:160])
    return found


# An instruction's result type and opcode: `%convert.9 = f32[64,128]{1,0} convert(%p)`.
_INSTR = re.compile(r"^\s*(?:ROOT )?%[\w.\-]+ = (\w+)\[([\d,]*)\]\S* ([\w\-]+)\(")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_HEADER = re.compile(r"^(?:ENTRY )?%([\w.\-]+) ")


def _computations(hlo_text: str) -> dict[str, list[str]]:
    """{computation name: its instruction lines} of an HLO module's text."""
    comps, name = {}, None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header and line.rstrip().endswith("{"):
            name = header.group(1)
            comps[name] = []
        elif line.startswith("}"):
            name = None
        elif name is not None:
            comps[name].append(line)
    return comps


def _result(m: re.Match, dtype: str, shapes: set[tuple[int, ...]]) -> bool:
    """Whether a matched instruction's result is of `dtype` and one of `shapes`."""
    return _DTYPES.get(m.group(1), m.group(1)) == dtype and \
        tuple(int(d) for d in m.group(2).split(",") if d) in shapes


def _converts_to(lines: list[str], dtype: str, shapes: set[tuple[int, ...]]) -> bool:
    """Whether `lines` hold a convert to `dtype` of one of `shapes`."""
    return any((m := _INSTR.match(line)) and m.group(3) == "convert" and _result(m, dtype, shapes) for line in lines)


def pool_converts(hlo_text: str, pool_leaves: Iterable[tuple[Iterable[int], object]]) -> list[str]:
    """The instructions of `hlo_text` that convert a whole pool leaf, in any dtype: a `convert`
    or `bitcast-convert` with a pool leaf's element count, or a fusion with that count holding
    one. XLA's CPU backend wraps a bfloat16 scatter in two of them (the pool to float32 and
    back: a whole pool's round trip per write), which is why the "xla" path keeps bfloat16 pools
    packed (pallas_kernels._common.PACKED). Fusion bodies are read through their callers."""
    counts = {leaf_signature(shape, dtype)[1] for shape, dtype in pool_leaves}
    comps = _computations(hlo_text)
    fused = {c for lines in comps.values() for line in lines if " fusion(" in line for c in _CALLS.findall(line)}

    def whole(m: re.Match) -> bool:
        return math.prod(int(d) for d in m.group(2).split(",") if d) in counts

    def converting(lines: list[str]) -> bool:
        return any((m := _INSTR.match(line)) and m.group(3) in _CONVERTS and whole(m) for line in lines)

    found = []
    for name, lines in comps.items():
        if name in fused:
            continue
        for line in lines:
            m = _INSTR.match(line)
            if m is None or not whole(m):
                continue
            called = _CALLS.findall(line) if m.group(3) == "fusion" else []
            if m.group(3) in _CONVERTS or any(converting(comps.get(c, [])) for c in called):
                found.append(line.strip()[:160])
    return found


_CONVERTS = ("convert", "bitcast-convert")


def whole_weight_converts(hlo_text: str, weight_shapes: Iterable[Iterable[int]], to="float32") -> list[str]:
    """The instructions of `hlo_text` (an executable's `as_text()`) that convert a whole weight to
    `to`: a result of dtype `to` and of one of `weight_shapes` (or its transpose) made by a
    `convert` or by a fusion holding such a convert, and any library fusion (`kind=kCustom`,
    e.g. YNNPACK's dot) holding one, which reads its operands whole. A convert fused into a
    consumer of another shape (the gather of a few embedding rows) is evaluated per element of
    that consumer's result and does not count. Shapes, not element counts, are matched: a pool
    leaf or the logits may have a weight's element count."""
    import numpy as np

    shapes = {tuple(int(d) for d in s) for s in weight_shapes}
    shapes |= {s[::-1] for s in shapes}
    to = np.dtype(to).name
    comps = _computations(hlo_text)
    fused = {c for lines in comps.values() for line in lines if " fusion(" in line for c in _CALLS.findall(line)}
    found = []
    for name, lines in comps.items():
        if name in fused:
            continue  # read through the fusion instructions that call it
        for line in lines:
            m = _INSTR.match(line)
            if m is None:
                continue
            called = _CALLS.findall(line) if m.group(3) == "fusion" else []
            converts = any(_converts_to(comps.get(c, []), to, shapes) for c in called)
            made = _result(m, to, shapes) and (m.group(3) == "convert" or converts)
            if made or ("kind=kCustom" in line and converts):
                found.append(line.strip()[:160])
    return found


# `%fusion.3 = f32[8,256]{1,0} fusion(%a, %b), kind=kLoop, calls=%fused_computation.3`: result
# dtype and dims, opcode, operand list.
_OP = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[([\d,]*)\]\S* ([\w\-]+)\(([^)]*)\)(.*)$")
# Opcodes that move no data: a whole expert tensor may pass through them (into a loop's tuple).
_VIEWS = {"parameter", "bitcast", "get-tuple-element", "tuple", "while", "call", "conditional",
          "optimization-barrier"}


def expert_relayouts(hlo_text: str, expert_shapes: Iterable[Iterable[int]]) -> list[str]:
    """The instructions of `hlo_text` (an executable's `as_text()`) that move or multiply a whole
    expert tensor, which a MoE step must not do: its cost would follow the number of experts,
    not the experts its tokens use (issue 33; `layers.routed_experts` reads one expert's slice
    per tile). An expert tensor is a value of one of `expert_shapes` (the `[E, H, I]` and
    `[E, I, H]` leaves) reached through views only (a parameter, a bitcast, a loop's tuple
    element). Reported: any other instruction taking one as an operand whose result has as many
    elements or more (a copy, transpose, convert or densified operand), any dot or library
    fusion (`kind=kCustom`, e.g. YNNPACK's) or fusion holding a dot that takes one whole (a
    product over every expert), and any copy or transpose with an expert tensor's shape,
    permuted (a relayout of one, however reached). Fusion bodies are read through the fusion
    instructions that call them."""
    shapes = {tuple(int(d) for d in s) for s in expert_shapes}
    whole = min(math.prod(s) for s in shapes)
    permuted = {tuple(sorted(s)) for s in shapes}
    comps = _computations(hlo_text)
    calls = _CALLS.findall
    fused = {c for lines in comps.values() for line in lines if " fusion(" in line for c in calls(line)}
    has_dot = {c for c in comps if any(" dot(" in line for line in comps[c])}
    found = []
    for comp, lines in comps.items():
        if comp in fused:
            continue
        views: set[str] = set()
        for line in lines:
            m = _OP.match(line)
            if m is None:
                continue
            out, opcode = m.group(1), m.group(4)
            dims = tuple(int(d) for d in m.group(3).split(",") if d)
            operands = set(re.findall(r"%([\w.\-]+)", m.group(5)))
            if opcode in _VIEWS:
                if dims in shapes or (opcode == "bitcast" and operands & views):
                    views.add(out)
                continue
            reads_whole = bool(operands & views)
            product = opcode == "dot" or "kind=kCustom" in m.group(6) or any(c in has_dot for c in calls(m.group(6)))
            if (reads_whole and (math.prod(dims) >= whole or product)) or \
                    (opcode in ("copy", "copy-start", "transpose") and tuple(sorted(dims)) in permuted):
                found.append(line.strip()[:160])
    return found
