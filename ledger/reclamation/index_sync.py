"""How the victim index follows the cache and the ledger: every cache edit queues its changes
(`change`: holders joining or leaving objects, points and owners whose facts moved), and `sync`
applies the queued batches on the cache it is given then (one re-keying per policy operation, on
its final facts) and then the objects whose replica exceptions differ in the ledger's state
(`ptrie.diff`), through one `IndexBatch` closed by `finish_batch`. A quote syncs before it reads.
"""
from __future__ import annotations

from ledger.reclamation.index import VictimIndex
from ledger.reclamation.index_batch import IndexBatch
from ledger.reclamation.index_rekey import finish_batch


def change(vi: VictimIndex | None, cache, *, holders=(), cids=(), owners=(), pools=None) -> VictimIndex | None:
    """Queue one batch: `holders` = (oid, holder, +1|-1) cache-holder changes (the cache's own
    listing), `cids` = points whose fallback, aliases or owner changed, `owners` = records or
    shared entries that changed; `pools` maps new objects to their pool. Applied by `sync`, on
    the cache it is given then (one re-keying per policy operation, on its final facts)."""
    if vi is None or not (holders or cids or owners):
        return vi
    return vi._replace(pending=vi.pending + ((tuple(holders), tuple(cids), tuple(owners), dict(pools or {})),))


def sync(vi: VictimIndex | None, state, cache) -> VictimIndex | None:
    """The index for this cache and the ledger's current replicas: the queued cache changes,
    then the objects whose replica exceptions differ (`ptrie.diff`)."""
    if vi is None or (vi.replica_exceptions is state.xrep and not vi.pending):
        return vi
    batch = IndexBatch(vi, cache)
    if vi.pending:
        owners, cids = {}, {}
        for holders, changed_cids, changed_owners, pools in vi.pending:
            _hold_runs(batch, holders, pools)
            owners.update(dict.fromkeys(changed_owners))
            cids.update(dict.fromkeys(changed_cids))
        for o in owners:
            batch.dirty_owner(o)
        for c in cids:
            batch.dirty_cid(c)
    batch.sync_replicas(state.xrep)
    return finish_batch(batch)


def _hold_runs(batch: IndexBatch, holders: tuple, pools: dict) -> None:
    """Runs of one holder change (a point's or a waiter's objects) are taken at once."""
    i, n = 0, len(holders)
    while i < n:
        _, h, sign = holders[i]
        j = i + 1
        while j < n and holders[j][1] == h and holders[j][2] == sign:
            j += 1
        if j - i == 1:
            batch.hold(holders[i][0], h, sign, pools.get(holders[i][0]))
        else:
            batch.hold_run([e[0] for e in holders[i:j]], h, sign, pools)
        i = j
