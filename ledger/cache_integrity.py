"""check_cache: recount the policy's references against the ledger's holders (doctrine 2).

Every checkpoint and waiting reference holds exactly the objects it lists (holder counts
exact, G-3); every `ckpt`/`wait` holder on an object belongs to a live checkpoint/waiter that
lists it; records and shared entries point at live checkpoints they own; the prefix index
lists exactly the non-snapshot checkpoints with no empty branch, and no inactive record is
empty (CFG-7); at most four anchors (REC-1). An active writer's StateImage (a `seq` holder) has
no other holder — no checkpoint, snapshot, waiter or second writer (BIND-5: KV pages may be
shared, a StateImage being written never is).
"""
from __future__ import annotations

from ledger import prefix_index as px
from ledger.cache_state import MAX_ANCHORS, CacheState, dep_item, indexed
from ledger.errors import IntegrityError
from ledger.integrity import check_integrity
from ledger.state import STATE_IMAGE, LedgerState


def check_cache(state: LedgerState, cache: CacheState) -> None:
    check_integrity(state)
    errs: list[str] = []
    want: dict = {}
    for cid, c in cache.checkpoints.items():
        for oid in set(c.object_ids()):
            want.setdefault(oid, set()).add(("ckpt", cid))
        kind, key = c.owner
        if kind == "rec":
            r = cache.records.get(key)
            if r is None or cid not in r.points():
                errs.append(f"checkpoint {cid} not listed by its record {key}")
        elif kind == "shared":
            e = cache.shared.get(key)
            if e is None or e.point != cid:
                errs.append(f"checkpoint {cid} not listed by its shared entry {key}")
        elif kind == "snap":
            use = cache.active.get(key)
            if use is None or use.snapshot != cid:
                errs.append(f"snapshot {cid} not listed by request {key!r}")
        elif kind == "wait":
            w = cache.waiters.get(key)
            if w is None or w.cid != cid:
                errs.append(f"checkpoint {cid} kept for waiter {key!r} that does not wait on it")
    for req, w in cache.waiters.items():
        if w.cid not in cache.checkpoints and not w.objects:
            errs.append(f"waiter {req!r} holds nothing")
        for oid in w.objects:
            want.setdefault(oid, set()).add(("wait", req))
    for oid, o in state.objects.items():
        have = {h for h in o.holders if h[0] in ("ckpt", "wait")}
        if have != want.get(oid, set()):
            errs.append(f"object {oid}: holders {sorted(map(repr, have))} != {sorted(map(repr, want.get(oid, set())))}")
    for oid in want:
        if oid not in state.objects:
            errs.append(f"object {oid} listed by the cache is gone")
    for oid, o in state.objects.items():  # BIND-5, doctrine 2: a writer's StateImage is its own
        if o.kind == STATE_IMAGE and len(o.holders) > 1 and any(h[0] == "seq" for h in o.holders):
            errs.append(f"StateImage {oid} of an active writer is shared: holders {sorted(map(repr, o.holders))}")
    for rid, r in cache.records.items():
        for cid in r.points():
            c = cache.checkpoints.get(cid)
            if c is None or c.owner != ("rec", rid):
                errs.append(f"record {rid} lists {cid} it does not own")
        if len(r.anchors) > MAX_ANCHORS:
            errs.append(f"record {rid} has {len(r.anchors)} anchors")
        if not r.points() and r.active is None:
            errs.append(f"record {rid} is empty and inactive (CFG-7)")
    for sid, e in cache.shared.items():
        if e.point not in cache.checkpoints:
            errs.append(f"shared entry {sid} lost its point")
    listed: dict = {}
    for k in px.branches_empty(cache.index):
        errs.append(f"empty index branch {k[:1] + k[2:]} (CFG-7)")
    for k, cids in px.entries(cache.index):
        for cid in cids:
            listed[cid] = k
    for cid, c in cache.checkpoints.items():
        if not indexed(c):
            if cid in listed:
                errs.append(f"non-public checkpoint {cid} is in the index")
        elif listed.get(cid) != px.key_of(c.identity):
            errs.append(f"checkpoint {cid} missing from the index")
    for cid in listed:
        if cid not in cache.checkpoints:
            errs.append(f"index lists dead checkpoint {cid}")
    from ledger.reclamation.prefixes import deepest_prefix_cid

    deps: dict = {}
    for cid, c in cache.checkpoints.items():  # RCL-5 facts: each fallback is the deepest prefix
        fb = cache.fallback.get(cid)
        if fb is None or (fb and fb not in cache.checkpoints):
            errs.append(f"checkpoint {cid}: fallback {fb} missing or dead")
            continue
        want_fb = deepest_prefix_cid(cache, c.identity, cid, strict=True)
        got_f = cache.checkpoints[fb].frontier if fb else 0
        want_f = cache.checkpoints[want_fb].frontier if want_fb else 0
        if got_f != want_f:
            errs.append(f"checkpoint {cid}: fallback at {got_f}, deepest prefix at {want_f}")
        deps.setdefault(fb, set()).add(cid)
    if set(cache.fallback) != set(cache.checkpoints):
        errs.append("fallback facts list other checkpoints")
    want_order = {a: sorted(dep_item(cache.checkpoints[d]) for d in ds if d in cache.checkpoints)
                  for a, ds in deps.items()}
    if {a: list(o) for a, o in cache.dep_order.items()} != want_order:
        errs.append("dependents (in token order) disagree with fallbacks")
    for s, rid in cache.sessions.items():
        if rid not in cache.records:
            errs.append(f"session {s!r} names dead record {rid}")
    if cache.victims is not None:  # RCL-4/RD-8 order and HEAT-4 footprint, recounted from scratch
        from ledger.reclamation import index_build, index_sync
        from ledger.reclamation.pricing import beyond_target_reference

        kept = index_sync.sync(cache.victims, state, cache)
        errs.extend(index_build.compare(kept, index_build.build(state, cache)))
        got, want = index_build.beyond_target(kept, state)[0], beyond_target_reference(state, cache)
        if got != want:
            errs.append(f"reuse segment: beyond the soft target {sorted(got)} != recounted {sorted(want)}")
    if errs:
        raise IntegrityError("cache integrity: " + "; ".join(errs[:20]))


def check_quote(state: LedgerState, cache: CacheState, q) -> None:
    """RCL-5/RCL-7: a quote never combines a move with the deletion of the moved content.

    Recounted from first principles: the chosen deletions (Host victims included) are applied
    to a scratch copy of the states; every object a chosen action moves (a demotion's pages, a
    dropped duplicate replica, a Host victim's replica drop) must be alive before, moved once,
    and still alive after those deletions."""
    from ledger.reclamation.edit import Edit

    e = Edit(state, cache)
    moved: list = []
    for a in q.chosen:
        for part in (a,) + tuple(a.host_victims):
            if part.kind != "delete":
                moved.extend((part.kind, oid) for oid in part.objects)
                continue
            for req in part.waiters:
                if req in e.cache.waiters:
                    e.end_wait(req)
            for cid in part.cids:
                if cid in e.cache.checkpoints:
                    e.drop_point(cid)
    errs, seen = [], set()
    for kind, oid in moved:
        if oid in seen:
            errs.append(f"object {oid} is moved twice")
        seen.add(oid)
        if oid not in state.objects:
            errs.append(f"{kind} of object {oid}, which does not exist")
        elif oid not in e.state.objects:
            errs.append(f"{kind} of object {oid}, which the quote's own deletions free")
    if errs:
        raise IntegrityError("quote integrity: " + "; ".join(errs[:20]))
