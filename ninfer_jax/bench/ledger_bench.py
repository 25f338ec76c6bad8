"""`ninfer bench ledger [--json]`: the cost of the pure resource ledger on the control thread.

Figures:
- cycle_us_p50 / cycle_us_p99: plan + commit one engine cycle's resident unit permits
  (RES-3) for C rows, on a ledger with `--pages` Main KV pages and `--objects` live objects.
- cycle_full_us_p50 / _p99: the same cycle plus one KV page allocated from a permit (a row
  crossing a page boundary), one older page released, and the settlement of every permit
  (RES-3): all the ledger work of one decode cycle.
- arena_alloc_us / arena_free_us: one first-fit Host arena allocation / one coalescing free
  with `--extents` extents in the arena (HOST-1).
- source_select_us_p50 / _p99: `ledger.query_sources` (SRC-1/2: index walk, exact verification,
  takeover kind, bytes, cost, ranking) for a follow-up prompt, with `--records` continuation
  records (each an E over 192 tokens, 100 shared system prompts with a shared entry each).
- reclaim_quote_us_p50 / _p99: `ledger.quote` for a one-slot StateImage gap over those records:
  `--records` candidate deletion actions, each with its loss against the surviving fallback
  (RCL-1..5), ranked and selected (RCL-4).
Progress goes to stderr; the CLI prints the returned dict.
"""
from __future__ import annotations

import argparse
import gc
from collections import deque
import random
import statistics
import sys
import time

import ledger as L
from ledger import arena as host


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="ninfer bench ledger")
    ap.add_argument("--rows", type=int, default=8, help="C: rows asking for a permit each cycle")
    ap.add_argument("--pages", type=int, default=65536, help="Main KV pages")
    ap.add_argument("--objects", type=int, default=10_000, help="live physical objects before timing")
    ap.add_argument("--extents", type=int, default=10_000, help="Host arena extents (free + used) before timing")
    ap.add_argument("--cycles", type=int, default=10_000)
    ap.add_argument("--records", type=int, default=None,
                    help="continuation records for the cache figures (default: --objects, i.e. 10k)")
    ap.add_argument("--queries", type=int, default=None, help="source queries timed (default: min(2000, --cycles))")
    ap.add_argument("--quotes", type=int, default=20, help="reclamation quotes timed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="accepted for symmetry; the CLI's --json decides printing")
    return ap.parse_args(argv)


def _log(msg: str) -> None:
    print(f"[bench ledger] {msg}", file=sys.stderr, flush=True)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _populated_state(args) -> L.LedgerState:
    c = args.rows
    state_bytes = 4 << 20
    cfg = L.LedgerConfig(
        pools=(
            L.PoolSpec(L.MAIN_KV, L.KV_PAGES, args.pages, 64 * 2 * 12 * 2 * 256 * 2, 64),
            L.PoolSpec("backend_kv:mtp", L.KV_PAGES, args.pages // 8, 64 * 2 * 2 * 256 * 2, 64),
            L.PoolSpec(L.STATE_POOL, L.STATE_SLOTS, 2 * c, state_bytes),
        ),
        host_capacity_bytes=L.default_host_capacity_bytes(state_bytes),
    )
    s = L.initial_state(cfg)
    # Live objects: records holding KV pages, every fourth record shares its first pages with
    # another holder (billed once, G-3), and some pages demoted to Host (arena extents).
    per = 50
    records = max(1, args.objects // per)
    for r in range(records):
        p = L.plan_allocate(s, L.MAIN_KV, per, ("rec", r))
        s = L.commit(s, p)
        oids = [a[0] for a in p.proof.allocated]
        if r % 4 == 0:
            s = L.commit(s, L.plan_add_holders(s, oids[:16], ("shared", r)))
        if r % 10 == 0:
            t = L.plan_begin_transfer(s, L.TransferRequest(L.TxnKind.DEMOTION, "bench", oids[:8], L.HOST_MEDIUM))
            s = L.commit(s, t)
            g = t.proof.generation
            for step in (L.plan_submit, L.plan_complete, L.plan_publish):
                s = L.commit(s, step(s, g))
    return s


def _bench_cycles(s: L.LedgerState, args) -> dict:
    rng = random.Random(args.seed)
    rows = list(range(args.rows))
    demands = [L.UnitDemand(("seq", r), L.UnitKind.DECODE, {L.MAIN_KV: 1, "backend_kv:mtp": 1}) for r in rows]
    permit_us, full_us = [], []
    recent: deque = deque()
    clock = time.perf_counter_ns
    for i in range(args.cycles):
        t0 = clock()
        plan = L.plan_cycle_permits(s, demands)
        s = L.commit(s, plan)
        t1 = clock()
        rows_proof = plan.proof.rows
        r = rng.randrange(len(rows))  # one row crosses a page boundary this cycle
        if not isinstance(rows_proof[r], L.Refusal):
            a = L.plan_allocate(s, L.MAIN_KV, 1, ("rec", "live", r), permit_id=rows_proof[r], owner=("seq", r))
            s = L.commit(s, a)
            recent.append((a.proof.allocated[0][0], r))
        if len(recent) > 256:  # and an older page is released (a request ended): ~constant live set
            oid, owner = recent.popleft()
            s = L.commit(s, L.plan_drop_holders(s, [oid], ("rec", "live", owner)))
        s = L.commit(s, L.plan_settle_all(s, [(pid, ("seq", k)) for k, pid in enumerate(rows_proof)
                                              if not isinstance(pid, L.Refusal)]))
        t2 = clock()
        permit_us.append((t1 - t0) / 1e3)
        full_us.append((t2 - t0) / 1e3)
    return {"cycle_us_p50": round(statistics.median(permit_us), 1), "cycle_us_p99": round(_pct(permit_us, 0.99), 1),
            "cycle_full_us_p50": round(statistics.median(full_us), 1), "cycle_full_us_p99": round(_pct(full_us, 0.99), 1),
            "live_objects_end": len(s.objects)}


def _bench_arena(args) -> dict:
    rng = random.Random(args.seed + 1)
    a = host.empty_arena(64 << 30)
    offsets = []
    for _ in range(args.extents):
        got = host.alloc(a, rng.choice((4096, 8192, 65536, 1 << 20)))
        a, off = got
        offsets.append(off)
    for off in offsets[::2]:  # every other allocation freed: ~n/2 free extents between n/2 used
        a = host.free(a, off)
    _log(f"arena: {a.free.count} free extents, {len(a.used)} allocations")
    n = min(5000, args.extents)
    sizes = [rng.choice((4096, 8192, 65536, 1 << 20, 4 << 20)) for _ in range(n)]
    alloc_ns, free_ns = [], []
    clock = time.perf_counter_ns
    for size in sizes:
        t0 = clock()
        a2, off = host.alloc(a, size)
        t1 = clock()
        a3 = host.free(a2, off)
        t2 = clock()
        alloc_ns.append(t1 - t0)
        free_ns.append(t2 - t1)
        a = a3 if rng.random() < 0.5 else a2  # drift the layout a little
    return {"arena_alloc_us": round(statistics.median(alloc_ns) / 1e3, 2),
            "arena_free_us": round(statistics.median(free_ns) / 1e3, 2),
            "arena_alloc_us_p99": round(_pct(alloc_ns, 0.99) / 1e3, 2),
            "arena_free_us_p99": round(_pct(free_ns, 0.99) / 1e3, 2),
            "arena_extents": a.free.count + len(a.used)}


def _cache_state(args):
    """`--records` records with an E each (state slot + 3 KV pages), 100 shared prefixes."""
    from ledger.cache_edit import Edit

    n = args.records
    cfg = L.LedgerConfig((L.PoolSpec(L.MAIN_KV, L.KV_PAGES, 3 * n + 1024, 1024, 64),
                          L.PoolSpec(L.STATE_POOL, L.STATE_SLOTS, n + 256, 4096)), 1 << 30)
    s, c = L.initial_state(cfg), L.empty_cache()
    prefixes = [[(97 * g + i) % 50_000 for i in range(128)] for g in range(100)]
    tokens = []
    for r in range(n):
        toks = prefixes[r % 100] + [(r * 31 + i) % 50_000 + 1 for i in range(64)]
        tokens.append(toks)
        e = Edit(s, c)
        cid = e.new_id()
        st = e.add(L.plan_allocate(e.state, L.STATE_POOL, 1, L.ckpt_holder(cid))).proof.allocated[0][0]
        pages = tuple(a[0] for a in e.add(L.plan_allocate(e.state, L.MAIN_KV, 3, L.ckpt_holder(cid))).proof.allocated)
        rec = e.new_record(publication=r + 1)
        e.put_point(L.Checkpoint(cid, ("rec", rec.rid), L.PointKind.END, L.identity_of(toks), st,
                                 ((L.MAIN_KV, pages),), r), hold=False)
        e.put_record(e.cache.records[rec.rid]._replace(end=cid))
        if r < 100:  # a shared entry at the end of each system prompt (SH-1), sharing two pages
            sid = e.new_id()
            sst = e.add(L.plan_allocate(e.state, L.STATE_POOL, 1, L.ckpt_holder(sid))).proof.allocated[0][0]
            e.add(L.plan_add_holders(e.state, pages[:2], L.ckpt_holder(sid)))
            e.put_point(L.Checkpoint(sid, ("shared", sid), L.PointKind.SHARED, L.identity_of(prefixes[r]), sst,
                                     ((L.MAIN_KV, pages[:2]),), r), hold=False)
            e.set(shared=e.cache.shared.set(sid, L.SharedEntry(sid, sid, L.Tier.NORMAL, 0, 0, True)))
        res = e.finish("bench")
        s, c = res.plan.result, res.cache
    return s, c, tokens


def _bench_cache(args) -> dict:
    rng = random.Random(args.seed + 2)
    if args.records is None:
        args.records = args.objects
    if args.queries is None:
        args.queries = min(2000, args.cycles)
    t = time.perf_counter()
    s, c, tokens = _cache_state(args)
    _log(f"cache: {len(c.records)} records, {len(c.checkpoints)} checkpoints in {time.perf_counter() - t:.1f}s")
    gc.collect()
    gc.freeze()  # as for the ledger state: a long-lived policy state is start-up heap to the GC
    clock = time.perf_counter_ns
    cost = L.CostModel()
    queries = []
    for _ in range(args.queries):
        toks = tokens[rng.randrange(len(tokens))] + [7, 7, 7]
        queries.append(L.SourceQuery("bench", L.identity_of(toks)))
    sel = []
    for q in queries:
        t0 = clock()
        best = L.query_sources(s, c, q, cost)[0]
        sel.append((clock() - t0) / 1e3)
        assert best.frontier == 192
    quotes = []
    ap = L.Applicant(L.ApplicantKind.NECESSARY, demote=False)
    gap = L.Gap(L.STATE_POOL, 1)
    actions = 0
    for _ in range(args.quotes):
        t0 = clock()
        q = L.quote(s, c, gap, ap)
        quotes.append((clock() - t0) / 1e3)
        actions = len(q.actions)
    return {"cache_records": len(c.records), "source_select_us_p50": round(statistics.median(sel), 1),
            "source_select_us_p99": round(_pct(sel, 0.99), 1), "reclaim_actions": actions,
            "reclaim_quote_us_p50": round(statistics.median(quotes), 1),
            "reclaim_quote_us_p99": round(_pct(quotes, 0.99), 1)}


def run(argv: list[str]) -> dict:
    args = _parse(argv)
    t = time.perf_counter()
    _log(f"building a ledger: {args.pages} Main KV pages, ~{args.objects} live objects")
    s = _populated_state(args)
    L.check_integrity(s)
    _log(f"built in {time.perf_counter() - t:.1f}s: {len(s.objects)} objects, {s.arena.free.count} free host extents")
    # A long-lived engine freezes its start-up heap so the cyclic GC does not rescan it every
    # cycle; without this, p99 shows multi-millisecond gen-2 collections, not ledger work.
    gc.collect()
    gc.freeze()
    _log(f"timing {args.cycles} cycles of {args.rows} rows")
    figures = {"rows": args.rows, "pages": args.pages, "live_objects": len(s.objects)}
    figures.update(_bench_cycles(s, args))
    _log("timing the Host arena")
    figures.update(_bench_arena(args))
    _log("timing source selection and reclamation quotes")
    figures.update(_bench_cache(args))
    figures["target_cycle_us_p50"] = 200.0
    figures["seconds"] = round(time.perf_counter() - t, 2)
    gc.unfreeze()
    return figures
