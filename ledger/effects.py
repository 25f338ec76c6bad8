"""Byte movements a committed plan asks the Program's stores to perform.

The ledger decides where bytes go; only the Program touches buffers. Effects are
data: a Device pool unit, a Host arena offset, a size. The stores run them after the ledger
part of the commit succeeded, in order.
"""
from __future__ import annotations

from typing import NamedTuple


class CopyToHost(NamedTuple):
    """Device pool unit -> Host arena bytes [offset, offset + nbytes) (D2H)."""

    pool: str
    unit: int
    offset: int
    nbytes: int


class CopyToDevice(NamedTuple):
    """Host arena bytes [offset, offset + nbytes) -> Device pool unit (H2D)."""

    offset: int
    pool: str
    unit: int
    nbytes: int


class CopyUnit(NamedTuple):
    """Device unit -> another unit of the same pool (copy-on-write of a tail page, BIND-4)."""

    pool: str
    src: int
    dst: int
