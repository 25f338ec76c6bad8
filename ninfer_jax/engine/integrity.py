"""The engine's integrity check (doctrine 2, docs/rules.md): the ledger and the cache policy
recounted from first principles, then every binding the engine keeps checked against them."""
from __future__ import annotations

import collections

import ledger
from ninfer_jax.engine.request import PAUSED
from ninfer_jax.engine.transactions import PendingKind

PAGE = ledger.PAGE_TOKENS


def check_engine(core) -> None:
    core.reuse.check()  # check_cache: every reference, with the ledger's check_integrity
    recount = core.program.check_integrity()
    state = core.program.state
    err = ledger.IntegrityError
    held: dict = collections.defaultdict(set)
    for oid, obj in state.objects.items():
        for h in obj.holders:
            if h[0] == "seq":
                held[h].add(oid)
    live = {r.key: r for r in core.residents}
    for key, oids in held.items():
        req = live.get(key)
        if req is None:
            raise err(f"{key} holds objects {sorted(oids)} but is not resident")
        if oids != set(req.objects):
            raise err(f"{key} holds {sorted(oids)}, its record says {sorted(req.objects)}")
        units = [state.objects[o].device.location for o in req.page_objects]
        if units != req.pages:
            raise err(f"{key}: page table {req.pages} differs from the ledger {units}")
        units = [state.objects[o].device.location for o in req.mtp_page_objects]
        if units != req.mtp_pages:
            raise err(f"{key}: MTP page table {req.mtp_pages} differs from the ledger {units}")
        if core.spec_k and len(req.mtp_pages) != len(req.pages):
            raise err(f"{key}: {len(req.mtp_pages)} MTP pages for {len(req.pages)} Main KV pages")
    for r in core.residents:
        if r.slot_object is None or r.key not in held:
            raise err(f"resident {r.request_id} has no StateImage slot")
        if len(r.pages) * PAGE < r.fed:
            raise err(f"{r.request_id}: frontier {r.fed} beyond its {len(r.pages)} pages")
        # BIND-5: what the writer computes into in place has no (stale) Host replica.
        tails = [pages[-1] for pages in (r.page_objects, r.mtp_page_objects) if pages and r.fed % PAGE]
        writable = [r.slot_object] + tails
        for oid in writable:
            if state.objects[oid].host is not None:
                raise err(f"{r.request_id} writes object {oid} in place but it keeps a Host replica")
    # RES-5, SCH-7: only the recovery permit outlives a cycle, held by its resident holder —
    # or, while a bind transaction is in flight, the permit it took with it (TXN-2).
    txns = core.reuse.txns
    txns.check()
    txn = state.transaction
    holder = core.preempt.holder
    outstanding = set(state.permits)
    if txn is not None and txn.permit_id is not None:
        outstanding.discard(txn.permit_id)
    if holder is not None:
        if holder not in core.residents or holder.recovery_permit != state.recovery_permit:
            raise err(f"recovery holder {holder.request_id} is not resident with permit {state.recovery_permit}")
        outstanding.discard(holder.recovery_permit)
    elif state.recovery_permit is not None and (txn is None or txn.permit_id != state.recovery_permit):
        raise err(f"recovery permit {state.recovery_permit} has no holder")
    if outstanding:
        raise err(f"permits outstanding between cycles: {sorted(outstanding)}")
    if len(core.residents) + txns.reserved_lanes() > core.c:
        raise err(f"{len(core.residents)} residents and {txns.reserved_lanes()} binds in flight for {core.c} lanes")
    # TXN-1/2: what waits for the transaction is still there, where it waits.
    pending = txns.live()
    if pending is not None and pending.request is not None:
        where = {r.ticket: "queued" for r in core.fresh}
        where.update({r.ticket: "paused" for r in core.preempt.paused})
        want = "paused" if pending.kind == PendingKind.PAUSE or pending.resume else "queued"
        if where.get(pending.request) != want:
            raise err(f"transaction {txn.generation} ({pending.kind}) waits for request {pending.request}, which is "
                      f"{where.get(pending.request, 'gone')}, not {want}")
    paused_tickets = {r.ticket for r in core.preempt.paused}
    for offload in txns.offloads:
        if offload.ticket not in paused_tickets:
            raise err(f"a deferred offload for request {offload.ticket}, which is not paused")
    paused = {r.ticket for r in core.preempt.paused}
    for r in core.preempt.paused:
        if r.bound is False or r.ticket not in core.reuse.cache.active or r in core.residents:
            raise err(f"paused {r.request_id} must be bound to its record and hold no lane")
        if r.phase != PAUSED or r.key in held:
            raise err(f"paused {r.request_id} holds a writable view (phase {r.phase})")
    queued = {r.ticket for r in core.fresh}
    if paused & queued:
        raise err(f"requests both paused and queued: {sorted(paused & queued)}")
    if not set(core.reuse.cache.waiters) <= queued:
        raise err(f"waiting references {sorted(core.reuse.cache.waiters)} for requests "
                  f"that are not queued {sorted(queued)}")
    bound = {r.ticket for r in core.by_id.values() if r.bound}
    if set(core.reuse.cache.active) != bound:
        raise err(f"cache binds {sorted(core.reuse.cache.active)}, engine {sorted(bound)}")
    if not core.residents and not paused and not core.reuse.cache.checkpoints and not core.reuse.cache.waiters:
        for pool_id, counts in recount.pools.items():
            if counts["used"] or counts["reserved"]:
                raise err(f"idle engine, empty cache, but pool {pool_id} has {counts}")
        if recount.host_used_bytes:
            raise err(f"idle engine, empty cache, but {recount.host_used_bytes} Host bytes used")
