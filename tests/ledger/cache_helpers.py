"""Small driver steps for the cache-policy tests (check_cache after every committed step)."""
from __future__ import annotations

import ledger as L
from ledger.outcomes import View
from ledger.simulate import CacheSim, SavePoint, small_config

PAGE = 1024
SLOT = 4096


def toks(n: int, base: int = 0) -> list[int]:
    return list(range(base, base + n))


def make(main=64, slots=8, host=1 << 16, chunk=64, backend=0) -> CacheSim:
    return CacheSim(small_config(main, slots, host, PAGE, SLOT, backend), chunk=chunk, check=True)


def start(sim: CacheSim, req, tokens, session=None, pick=0, ticket=0):
    """Query and bind the `pick`-th candidate; returns (candidate, view)."""
    ident = L.identity_of(tokens)
    cands = L.query_sources(sim.state, sim.cache, L.SourceQuery(req, ident, session), sim.cost)
    cand = cands[pick]
    res = L.plan_bind(sim.state, sim.cache, L.BindRequest(req, cand, session, ticket=ticket))
    assert isinstance(res, L.CacheResult), res
    sim.apply(res)
    v = [o for o in res.outcome if isinstance(o, View)][0]
    return cand, L.SequenceView(req, ident.prefix(cand.frontier), v.state_object, v.kv)


def compute(sim: CacheSim, view, tokens, upto=None):
    upto = len(tokens) if upto is None else upto
    return sim.grow(view, L.identity_of(tokens), upto)


def capture(sim: CacheSim, view, private=L.PointKind.INPUT, shared=False, input_kind="ResponseReplay",
            allow_reclaim=True):
    res = L.plan_capture(sim.state, sim.cache, L.CaptureRequest(view, private, input_kind, shared,
                                                                 allow_reclaim=allow_reclaim))
    if isinstance(res, L.CacheResult):
        sim.apply(res)
    return res


def end(sim: CacheSim, view, cancel=False):
    res = L.plan_publish_end(sim.state, sim.cache, view, cancel=cancel)
    sim.apply(res)
    return res


def served(sim: CacheSim, tokens, req="probe", session=None):
    return L.query_sources(sim.state, sim.cache, L.SourceQuery(req, L.identity_of(tokens), session), sim.cost)


def record_of(sim: CacheSim, req_or_rid):
    return sim.cache.records[req_or_rid]


def points(sim: CacheSim, kind=None):
    return [c for c in sim.cache.checkpoints.values() if kind is None or c.kind == kind]


def holders(sim: CacheSim, oid):
    return sim.state.objects[oid].holders


__all__ = ["L", "CacheSim", "SavePoint", "toks", "make", "start", "compute", "capture", "end", "served", "record_of",
           "points", "holders", "PAGE", "SLOT"]
