"""Occupancy for observation (OBS-1, CFG-5): read straight from the state, never a quota.

Per-kind Host usage is reported for observation only; the arena is one shared backing and
the kinds are not separate quotas (CFG-5).
"""
from __future__ import annotations

from ledger.state import LedgerState


def usage(state: LedgerState) -> dict:
    pools = {}
    for pid, p in state.pools.items():
        cap = p.spec.capacity
        pools[pid] = {"capacity": cap, "used": cap - len(p.free), "free": len(p.free), "reserved": p.reserved,
                      "available": p.available}
    by_kind: dict[str, int] = {}
    pending = 0
    for o in state.objects.values():
        if o.host is not None:
            if o.host.complete:
                by_kind[o.kind] = by_kind.get(o.kind, 0) + o.host.nbytes
            else:
                pending += o.host.nbytes
    a = state.arena
    host = {"capacity": a.capacity, "used": a.used_bytes, "free": a.free_bytes, "largest_free_extent": a.largest_free,
            "free_extents": a.free.count, "allocations": len(a.used), "by_kind": by_kind, "transfer_destinations": pending}
    return {"pools": pools, "host": host, "objects": len(state.objects), "permits": len(state.permits),
            "leases": len(state.leases), "transaction": None if state.transaction is None else
            {"generation": state.transaction.generation, "kind": state.transaction.kind,
             "phase": state.transaction.phase}}
