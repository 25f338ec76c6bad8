"""The prefix index (CKP-4, SRC-1, CFG-7).

A checkpoint's identity is filed under its full blocks (block count and digest of the last
full block), then under its tail: the tokens after those blocks (0..BLOCK-1 of them), by
length and then by the exact tokens. A query walks its own block chain and, in each block that
holds points, probes only the tail lengths present there with its own tokens, so it meets only
checkpoints whose tokens are a prefix of its own — however many points share one block (a
common system prompt followed by many short user turns). The digest and the tail only narrow
candidates: every candidate is still verified exactly (`InputIdentity.is_prefix_of`: tokens,
positions, media, execution), so content computed independently is never spliced in because
digests agree. Empty branches are deleted at once (CFG-7).

Layout: `index[(k, digest)][tail length][tail tokens] -> frozenset of checkpoint ids`.
"""
from __future__ import annotations

import immutables

from ledger.identity import BLOCK, InputIdentity

_ROOT_KEY = (0, b"")
_EMPTY = immutables.Map()


def block_key(ident: InputIdentity) -> tuple:
    k = len(ident.tokens) // BLOCK
    return (k, ident.blocks[k - 1]) if k else _ROOT_KEY


def key_of(ident: InputIdentity) -> tuple:
    """Where `ident` is filed: (block count, last full block digest, tail tokens)."""
    k = len(ident.tokens) // BLOCK
    return block_key(ident) + (tuple(ident.tokens[k * BLOCK:]),)


def add(index: immutables.Map, ident: InputIdentity, cid: int) -> immutables.Map:
    bk, tail = block_key(ident), tuple(ident.tokens[len(ident.tokens) // BLOCK * BLOCK:])
    bucket = index.get(bk, _EMPTY)
    by_tail = bucket.get(len(tail), _EMPTY)
    by_tail = by_tail.set(tail, by_tail.get(tail, frozenset()) | {cid})
    return index.set(bk, bucket.set(len(tail), by_tail))


def remove(index: immutables.Map, ident: InputIdentity, cid: int) -> immutables.Map:
    bk, tail = block_key(ident), tuple(ident.tokens[len(ident.tokens) // BLOCK * BLOCK:])
    bucket = index.get(bk, _EMPTY)
    by_tail = bucket.get(len(tail), _EMPTY)
    left = by_tail.get(tail, frozenset()) - {cid}
    by_tail = by_tail.set(tail, left) if left else (by_tail.delete(tail) if tail in by_tail else by_tail)
    bucket = bucket.set(len(tail), by_tail) if by_tail else (bucket.delete(len(tail)) if len(tail) in bucket
                                                             else bucket)
    return index.set(bk, bucket) if bucket else (index.delete(bk) if bk in index else index)  # CFG-7


def same(index: immutables.Map, ident: InputIdentity) -> frozenset:
    """Checkpoint ids filed with exactly `ident`'s tokens (not yet verified beyond them)."""
    n = len(ident.tokens)
    tail = tuple(ident.tokens[n // BLOCK * BLOCK:])
    return index.get(block_key(ident), _EMPTY).get(len(tail), _EMPTY).get(tail, frozenset())


def _bucket_hits(bucket, toks, lo: int, lim: int, lengths):
    for m in lengths:
        if lo + m > lim:
            continue
        got = bucket[m].get(tuple(toks[lo:lo + m]))
        if got:
            yield lo + m, got


def candidates(index: immutables.Map, query: InputIdentity):
    """Checkpoint ids on the query's hit path, shallowest first (not yet verified): those whose
    full blocks' digest and tail tokens agree with the query's."""
    toks, n = query.tokens, len(query.tokens)
    blocks = query.blocks
    for k in range(0, min(len(blocks), n // BLOCK) + 1):
        bucket = index.get((k, blocks[k - 1]) if k else _ROOT_KEY)
        if bucket:
            for _, got in _bucket_hits(bucket, toks, k * BLOCK, n, sorted(bucket.keys())):
                yield from got


def deepest(index: immutables.Map, query: InputIdentity, lim: int):
    """(frontier, checkpoint ids) on the query's hit path with frontier <= lim, deepest first."""
    toks, blocks = query.tokens, query.blocks
    for k in range(min(len(blocks), lim // BLOCK), -1, -1):
        bucket = index.get((k, blocks[k - 1]) if k else _ROOT_KEY)
        if bucket:
            yield from _bucket_hits(bucket, toks, k * BLOCK, lim, sorted(bucket.keys(), reverse=True))


def entries(index: immutables.Map):
    """Every filed (key_of, checkpoint ids), for integrity checks."""
    for bk, bucket in index.items():
        for by_tail in bucket.values():
            for tail, cids in by_tail.items():
                yield bk + (tail,), cids


def branches_empty(index: immutables.Map) -> list:
    """CFG-7: keys of branches that hold nothing (there must be none)."""
    out = []
    for bk, bucket in index.items():
        if not bucket:
            out.append(bk)
        for m, by_tail in bucket.items():
            if not by_tail:
                out.append(bk + (m,))
            out.extend(bk + (m, t) for t, cids in by_tail.items() if not cids)
    return out
