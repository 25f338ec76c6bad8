"""Plans, refusals, and the pure half of commit.

Every change to a ledger is a `Plan`: its diff (`ops`), the byte movements for the stores
(`effects`), the `proof` of what it reserves, allocates and frees and why, and the
preconditions it relies on. A planner that cannot proceed for an ordinary reason (shortage,
a transaction already running) returns a `Refusal` with the exact shortfall per pool instead
(RES-2). Evaluating either changes nothing: states are immutable.

`commit(state, plan)` returns the new state. When `state` is the very state the plan was
made from, that is `plan.result`; otherwise the diff is replayed against `state`, each op
re-checking its precondition, and any failure raises `StalePlan` with `state` untouched:
nothing is half-applied. The Program's `commit` calls this first and moves bytes only after.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import immutables

from ledger.arena import HostShortfall
from ledger.errors import InvalidRequest, StalePlan
from ledger.ops import Builder, Precondition
from ledger.state import LedgerState


class Shortfall(NamedTuple):
    """Exactly what is missing: units per device pool, bytes under HOST, placement detail."""

    pools: immutables.Map  # pool id -> units missing (HOST -> bytes missing)
    host: HostShortfall | None = None

    def __bool__(self) -> bool:
        return bool(self.pools) or self.host is not None


class Refusal(NamedTuple):
    """A typed, ordinary "no": nothing was reserved, nothing changed.

    reason: "shortfall" (see `shortfall`), "transaction_busy" (TXN-1), "recovery_permit_held"
    (SCH-7), "protected" (a lease or pin forbids it).
    """

    reason: str
    shortfall: Shortfall | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return False


class Proof(NamedTuple):
    """Why a plan is allowed and what it does, in the ledger's own terms."""

    reserved: tuple[tuple[str, int], ...] = ()  # (pool, units) reserved by count
    permits: tuple[int, ...] = ()  # permit ids granted
    rows: tuple = ()  # per row of a batch: its permit id, or its Refusal (RES-3)
    allocated: tuple[tuple[int, str, int], ...] = ()  # (object id, pool, unit)
    host_placed: tuple[tuple[int, int], ...] = ()  # (object id, arena offset)
    freed: tuple[int, ...] = ()  # object ids whose bytes were released
    kept: tuple[int, ...] = ()  # object ids a dropped reference left alive (G-3)
    released: tuple[tuple[str, int], ...] = ()  # (pool, units) returned to availability
    leases: tuple[int, ...] = ()  # lease ids taken
    victims: tuple = ()  # objects a reclamation plan deletes or demotes (RCL-*, a later issue)
    generation: int | None = None  # the transaction handle (TXN-2)
    note: str = ""


@dataclass(frozen=True, eq=False)
class Plan:
    kind: str
    ops: tuple
    effects: tuple
    proof: Proof
    base: LedgerState = field(repr=False)
    result: LedgerState = field(repr=False)
    ok = True

    @property
    def preconditions(self) -> tuple[Precondition, ...]:
        return tuple(p for op in self.ops for p in op.requires())


def finish(b: Builder, kind: str, proof: Proof) -> Plan:
    """Close a planner's builder into a Plan (its result is the builder's new state)."""
    return Plan(kind, tuple(b.ops), tuple(b.effects), proof, b.base, b.finish())


def shortfall(pools: dict[str, int], host: HostShortfall | None = None) -> Refusal:
    missing = {k: v for k, v in pools.items() if v > 0}
    return Refusal("shortfall", Shortfall(immutables.Map(missing), host),
                   "short: " + ", ".join(f"{k} {v}" for k, v in sorted(missing.items())))


def commit(state: LedgerState, plan: Plan) -> LedgerState:
    """Apply a plan to `state` in one step, or raise StalePlan and apply nothing."""
    if not isinstance(plan, Plan):
        raise InvalidRequest(f"commit needs a Plan, got {type(plan).__name__}"
                             + (f" ({plan.reason}: {plan.detail})" if isinstance(plan, Refusal) else ""))
    if plan.base is state:
        return plan.result
    if plan.base.config != state.config:
        raise StalePlan("the plan was made for another ledger configuration")
    b = Builder(state)
    for op in plan.ops:
        op.apply(b)
    return b.finish()
