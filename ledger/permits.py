"""Reservations and unit permits (RES-1..5).

A `UnitDemand` is what one unit needs from each typed pool, computed by the Program from the
real binding (RES-1). A demand is granted whole or refused whole with the exact shortfall per
pool (RES-2). A batch of demands is granted row by row in the order given (the engine orders
them recovery first, then by original ticket, RES-3): the runnable subset is granted even if
some row is short. Fresh admission can only use what is still available, which never
includes units another permit holds (RES-3). Settling returns what the unit did not use.
"""
from __future__ import annotations

from typing import Hashable, Iterable, Mapping, NamedTuple

import immutables

from ledger import validate as v
from ledger.errors import InvalidRequest, NotAHolder, UnknownPermit
from ledger.ops import Builder, DeletePermit, PutPermit, Reserve, SetRecoveryPermit, Unreserve
from ledger.plan import Plan, Proof, Refusal, finish, shortfall
from ledger.state import LedgerState, RecoveryPermit, UnitKind, UnitPermit


class UnitDemand(NamedTuple):
    """Typed pool units one unit needs (RES-1): e.g. {"main_kv": 1, "backend_kv:mtp": 1}.

    kind RECOVERY asks for the full recovery permit (RES-5): State, missing KV, tail page and
    coverage up to the old frontier plus the first real new unit, in one go.
    """

    owner: Hashable
    kind: str
    amounts: Mapping[str, int]


def _validate(state: LedgerState, d) -> tuple[tuple[str, int], ...]:
    if type(d) is not UnitDemand and not isinstance(d, UnitDemand):
        raise InvalidRequest(f"expected a UnitDemand, got {type(d).__name__}")
    if d.kind not in _KINDS:
        raise InvalidRequest(f"unit kind {d.kind!r} not in {UnitKind.ALL}")
    v.hashable(d.owner, "owner")
    amounts = d.amounts
    if type(amounts) not in (dict, immutables.Map) and not isinstance(amounts, Mapping):
        raise InvalidRequest(f"amounts must map pool id -> units, got {type(amounts).__name__}")
    pools = state.pools
    out = []
    for pool, n in amounts.items():
        p = pools.get(pool)
        if p is None:
            state.pool(pool)  # raises the typed error naming the known pools
        if type(n) is not int or n < 0 or n > p.spec.capacity:
            v.count(n, f"demand for {pool!r}", 0, p.spec.capacity)
        if n:
            out.append((pool, n))
    return tuple(out)


_KINDS = frozenset(UnitKind.ALL)


def _grant(b: Builder, d: UnitDemand, amounts: tuple[tuple[str, int], ...]) -> int | Refusal:
    recovery = d.kind == UnitKind.RECOVERY
    if recovery and b.recovery_permit is not None:  # SCH-7: one recovery permit at a time
        return Refusal("recovery_permit_held", None, f"permit {b.recovery_permit} holds it")
    for pool, n in amounts:  # RES-2: check every pool before reserving any
        if n > b.available(pool):
            return shortfall({pool: n - b.available(pool) for pool, n in amounts})
    pid = b.new_id()
    for pool, n in amounts:
        b.do(Reserve(pool, n))
    cls = RecoveryPermit if recovery else UnitPermit
    b.do(PutPermit(cls(pid, d.owner, d.kind, immutables.Map(amounts))))
    if recovery:
        b.do(SetRecoveryPermit(None, pid))
    return pid


def plan_unit_permit(state: LedgerState, demand: UnitDemand) -> Plan | Refusal:
    """One unit's permit: every typed pool at once or a Refusal naming each pool's gap (RES-2)."""
    amounts = _validate(state, demand)
    b = Builder(state)
    got = _grant(b, demand, amounts)
    if isinstance(got, Refusal):
        return got
    return finish(b, "unit_permit", Proof(reserved=amounts, permits=(got,), rows=(got,)))


def plan_cycle_permits(state: LedgerState, demands: Iterable[UnitDemand]) -> Plan:
    """Permits for a cycle's rows in the given order (RES-3); `proof.rows[i]` is row i's
    permit id or its Refusal. The granted rows form the runnable subset."""
    demands = tuple(demands)
    checked = [_validate(state, d) for d in demands]  # bad input fails before any planning
    b = Builder(state)
    rows, granted, reserved = [], [], {}
    for d, amounts in zip(demands, checked):
        got = _grant(b, d, amounts)
        rows.append(got)
        if not isinstance(got, Refusal):
            granted.append(got)
            for pool, n in amounts:
                reserved[pool] = reserved.get(pool, 0) + n
    return finish(b, "cycle_permits", Proof(reserved=tuple(reserved.items()), permits=tuple(granted),
                                            rows=tuple(rows)))


def _settle(b: Builder, permit_id, owner, released: dict) -> None:
    p = b.permit(permit_id) if isinstance(permit_id, int) and not isinstance(permit_id, bool) else None
    if p is None:
        raise UnknownPermit(f"no outstanding permit {permit_id!r} (already settled?)")
    if p.owner != owner:
        raise NotAHolder(f"permit {permit_id} belongs to {p.owner!r}, not {owner!r}")
    for pool, n in p.remaining.items():
        if n:
            b.do(Unreserve(pool, n))
            released[pool] = released.get(pool, 0) + n
    b.do(DeletePermit(p))
    if isinstance(p, RecoveryPermit):
        b.do(SetRecoveryPermit(permit_id, None))


def plan_settle(state: LedgerState, permit_id: int, owner: Hashable) -> Plan:
    """Settle one permit: its unused reservation returns to the pools (RES-3, RES-5)."""
    return plan_settle_all(state, ((permit_id, owner),))


def plan_settle_all(state: LedgerState, settlements: Iterable[tuple[int, Hashable]]) -> Plan:
    """Settle several permits (the end of a cycle) in one plan."""
    settlements = tuple(settlements)
    ids = [s[0] for s in settlements]
    if len(set(ids)) != len(ids):
        raise InvalidRequest(f"permit settled twice in one plan: {ids}")
    b = Builder(state)
    released: dict[str, int] = {}
    for pid, owner in settlements:
        _settle(b, pid, owner, released)
    return finish(b, "settle", Proof(released=tuple(released.items()), permits=tuple(ids)))
