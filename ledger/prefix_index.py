"""The prefix index (CKP-4, SRC-1, CFG-7).

Keys are (full blocks, digest of the last full block) of a checkpoint's identity; each key
holds the checkpoints whose frontier lies in that block. A query walks its own block chain,
so it only meets checkpoints on its hit path; the digest only narrows candidates and every
candidate is then verified exactly (`InputIdentity.is_prefix_of`: tokens, positions, media,
execution), so content computed independently is never spliced in because digests agree.
Empty branches are deleted at once (CFG-7).
"""
from __future__ import annotations

import immutables

from ledger.identity import BLOCK, InputIdentity

_ROOT_KEY = (0, b"")


def key_of(ident: InputIdentity) -> tuple:
    k = len(ident.tokens) // BLOCK
    return (k, ident.blocks[k - 1]) if k else _ROOT_KEY


def add(index: immutables.Map, ident: InputIdentity, cid: int) -> immutables.Map:
    k = key_of(ident)
    return index.set(k, index.get(k, frozenset()) | {cid})


def remove(index: immutables.Map, ident: InputIdentity, cid: int) -> immutables.Map:
    k = key_of(ident)
    left = index.get(k, frozenset()) - {cid}
    return index.set(k, left) if left else index.delete(k)  # CFG-7: no empty branch is kept


def candidates(index: immutables.Map, query: InputIdentity):
    """Checkpoint ids on the query's hit path, shallowest block first (not yet verified)."""
    got = index.get(_ROOT_KEY)
    if got:
        yield from got
    for k, d in enumerate(query.blocks, 1):
        got = index.get((k, d))
        if got:
            yield from got
