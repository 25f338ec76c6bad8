"""Input checks shared by the planners: bad input raises a typed error before any planning."""
from __future__ import annotations

from typing import Hashable, Iterable

from ledger.errors import ExceedsCapacity, InvalidRequest, UnknownObject
from ledger.state import MEDIA, LedgerState, PhysicalObject


def count(n, what: str, lo: int = 0, hi: int | None = None) -> int:
    if not isinstance(n, int) or isinstance(n, bool):
        raise InvalidRequest(f"{what} must be an int, got {type(n).__name__}")
    if n < lo:
        raise InvalidRequest(f"{what} must be >= {lo}, got {n}")
    if hi is not None and n > hi:
        raise ExceedsCapacity(f"{what} = {n} exceeds the capacity {hi}")
    return n


def hashable(h, what: str) -> Hashable:
    try:
        hash(h)
    except TypeError:
        raise InvalidRequest(f"{what} {h!r} is not hashable") from None
    return h


def medium(m) -> str:
    if m not in MEDIA:
        raise InvalidRequest(f"medium must be one of {MEDIA}, got {m!r}")
    return m


def ids(values: Iterable, what: str) -> tuple[int, ...]:
    """A non-empty tuple of distinct int ids (a repeated id in one call is a double release)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InvalidRequest(f"{what} must be an iterable of ids, got {type(values).__name__}")
    out = tuple(values)
    if not out:
        raise InvalidRequest(f"{what}: empty")
    for i in out:
        if not isinstance(i, int) or isinstance(i, bool):
            raise InvalidRequest(f"{what}: id {i!r} is not an int")
    if len(set(out)) != len(out):
        raise InvalidRequest(f"{what}: repeated id in {out}")
    return out


def live_object(state_or_builder, object_id: int) -> PhysicalObject:
    o = state_or_builder.obj(object_id) if not isinstance(state_or_builder, LedgerState) \
        else state_or_builder.objects.get(object_id)
    if o is None:
        raise UnknownObject(f"no live physical object {object_id}")
    return o
