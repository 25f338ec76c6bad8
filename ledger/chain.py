"""Compose several ledger planners into one `Plan` (all or nothing).

The policy's operations are sequences of primitive plans (drop holders, add holders,
allocate, copy-on-write, a permit). `Chain` applies each to the state the previous one left
and closes them into one plan whose ops and effects are the concatenation, whose base is the
first state and whose result is the last: the Program commits it in one step,
and a Refusal anywhere leaves nothing behind (RES-2).
"""
from __future__ import annotations

from ledger.plan import Plan, Proof, Refusal
from ledger.state import LedgerState

_TUPLE_FIELDS = ("reserved", "permits", "rows", "allocated", "host_placed", "freed", "kept", "released", "leases",
                 "victims")


class Chain:
    __slots__ = ("base", "state", "ops", "effects", "proofs")

    def __init__(self, state: LedgerState):
        self.base = state
        self.state = state
        self.ops: list = []
        self.effects: list = []
        self.proofs: list = []

    def add(self, plan):
        """Append a primitive plan made on `self.state`; returns it (or the Refusal unchanged)."""
        if isinstance(plan, Refusal):
            return plan
        assert plan.base is self.state, "each step must be planned on the chain's current state"
        self.ops.extend(plan.ops)
        self.effects.extend(plan.effects)
        self.proofs.append(plan.proof)
        self.state = plan.result
        return plan

    def finish(self, kind: str, note: str = "", victims: tuple = ()) -> Plan:
        merged = {f: [] for f in _TUPLE_FIELDS}
        gen = None
        for p in self.proofs:
            for f in _TUPLE_FIELDS:
                merged[f].extend(getattr(p, f))
            if p.generation is not None:
                gen = p.generation
        merged["victims"].extend(victims)
        proof = Proof(**{f: tuple(v) for f, v in merged.items()}, generation=gen, note=note)
        return Plan(kind, tuple(self.ops), tuple(self.effects), proof, self.base, self.state)
