"""Exact prefixes among the cache's checkpoints (CKP-4, RCL-5): `aliases` (indexed points with
exactly one identity) and `deepest_prefix_cid` (the deepest indexed point that is an exact prefix
of an identity). The fallback a deletion is priced against (ledger/reclamation/pricing.py) and
the fallback facts every cache edit keeps (ledger/reclamation/edit.py) are both read from here.
"""
from __future__ import annotations

from ledger import prefix_index as px
from ledger.cache_state import CacheState, Checkpoint


def aliases(cache: CacheState, c: Checkpoint) -> list:
    """Indexed checkpoints with exactly c's identity (c itself included when indexed): the
    index files them under the same tokens; the whole identity is then compared (CKP-4)."""
    ident = c.identity
    cps = cache.checkpoints
    out = []
    for a in px.same(cache.index, ident):
        d = cps.get(a)
        if d is not None and (d.identity is ident or d.identity == ident):
            out.append(a)
    return out


def deepest_prefix_cid(cache: CacheState, ident, exclude: int = 0, strict: bool = False) -> int:
    """The deepest indexed checkpoint (not `exclude`) that is an exact prefix of `ident`
    (with `strict`, strictly shorter): the index key narrows by digest, then tokens, media,
    positions and execution are compared (CKP-4). Ties at one frontier: the lowest id. 0: root."""
    cps = cache.checkpoints
    toks, n = ident.tokens, len(ident.tokens)
    lim = n - 1 if strict else n
    for m, got in px.deepest(cache.index, ident, lim):  # deepest first: a verified hit beats shallower ones
        best_cid = 0
        for cid in got:
            if cid == exclude or (best_cid and cid > best_cid):
                continue
            d = cps[cid].identity
            if d.execution == ident.execution and d.tokens == toks[:m] and d.position_scheme == ident.position_scheme \
                    and d.media == tuple(x for x in ident.media if x[0] < m):
                best_cid = cid
        if best_cid:
            return best_cid
    return 0
