"""Reads a compiled step's optimized HLO for what would make its cost follow the pools' size.

A step that updates a pool in place costs what it touches. XLA can still copy a whole pool
leaf inside the step — when a read of the old pool is not ordered before the in-place write
(copy insertion then keeps the old buffer alive by copying it), or when a write is duplicated
into two fusions — and donation alone does not show it: the output still aliases the input.
`pool_copies` finds those copies in the compiled text; the test of every step at every bucket
(tests/model/test_in_place.py) and `ninfer bench engine`'s capacity ratio rest on it.
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

