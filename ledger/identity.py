"""The ledger's own input identity (CKP-1, CKP-4): exact tokens, positions, media, execution.

The ledger imports nothing from the frontend. The frontend's `FrontierIdentity` maps onto an
`InputIdentity` one to one: `tokens` is `FrontierIdentity.tokens`, `media` its media ranges as
`(start, end, digest)` triples, `position_scheme` its scheme, and `execution` a tag the engine
adds (model, dtype and speculative backend: state computed under another execution identity
is never adopted). The block digests are the ledger's own chain over `block` tokens (one Main
KV page); they only narrow candidates in the prefix index, adoption compares the exact fields.
"""
from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple, Sequence

from ledger.errors import InvalidRequest

BLOCK = 64  # tokens per digest block: one Main KV page
_ROOT = hashlib.blake2b(b"ninfer-ledger/identity/v1", digest_size=16).digest()


class InputIdentity(NamedTuple):
    """Everything that identifies the input prefix [0, len(tokens)) (CKP-1).

    `blocks[i]` is the chained digest of tokens [0, BLOCK*(i+1)) (and the media inside); it
    only narrows candidates (CKP-4)."""

    tokens: tuple
    media: tuple = ()  # ((start, end, digest), ...) sorted by start
    position_scheme: str = "linear"
    execution: str = ""
    blocks: tuple = ()

    @property
    def frontier(self) -> int:
        return len(self.tokens)

    def prefix(self, n: int) -> "InputIdentity":
        """The identity of [0, n): exact, with the shared block digests (no rehash)."""
        if not 0 <= n <= len(self.tokens):
            raise InvalidRequest(f"prefix {n} outside [0, {len(self.tokens)}]")
        if any(s < n < e for s, e, _ in self.media):
            raise InvalidRequest(f"frontier {n} splits a media range (SH-7)")
        return InputIdentity(self.tokens[:n], tuple(m for m in self.media if m[0] < n), self.position_scheme,
                             self.execution, self.blocks[: n // BLOCK])

    def cut(self, n: int) -> "InputIdentity":
        """The identity of [0, n) for a live sequence whose frontier lies inside a media range
        (a prefill chunk may end there): the split item's range is clipped to n and marked
        partial. No recovery point is ever inside media (SH-7), so this identity is a prefix of
        none: it names a view that is released or replayed, never adopted (CKP-4)."""
        if not any(s < n < e for s, e, _ in self.media):
            return self.prefix(n)
        media = tuple((s, min(e, n), d if e <= n else f"{d}#partial") for s, e, d in self.media if s < n)
        return InputIdentity(self.tokens[:n], media, self.position_scheme, self.execution, self.blocks[: n // BLOCK])

    def is_prefix_of(self, other: "InputIdentity") -> bool:
        """CKP-4: the exact check adoption makes (tokens, positions, media, execution)."""
        n = len(self.tokens)
        if n > len(other.tokens) or self.position_scheme != other.position_scheme:
            return False
        if self.execution != other.execution:
            return False
        if self.blocks != other.blocks[: len(self.blocks)]:  # cheap reject first
            return False
        if other.tokens[:n] != self.tokens:
            return False
        return self.media == tuple(m for m in other.media if m[0] < n)


def _chain(tokens: tuple, media: tuple, prev: bytes = _ROOT, first: int = 0) -> tuple:
    """The block digests of tokens [first, ...) (whole blocks), chained from `prev`."""
    out = []
    n = len(tokens) - len(tokens) % BLOCK
    data = memoryview(struct.pack(f"<{n - first}q", *tokens[first:n]))  # packed once; each block hashes its slice
    for lo in range(first, n, BLOCK):
        hi = lo + BLOCK
        h = hashlib.blake2b(prev, digest_size=16)
        h.update(data[(lo - first) * 8:(hi - first) * 8])
        for s, e, d in media:
            if s < hi and e > lo:
                h.update(repr((s, e, d)).encode())
        prev = h.digest()
        out.append(prev)
    return tuple(out)


def identity_of(tokens: Sequence[int], media: Sequence = (), position_scheme: str = "linear",
                execution: str = "") -> InputIdentity:
    """Build an identity from token ids (and media ranges `(start, end, digest)`)."""
    toks = tuple(tokens)
    if not set(map(type, toks)) <= {int}:  # checked at C speed; the loop names the culprit
        for t in toks:
            if type(t) is not int:
                raise InvalidRequest(f"token ids must be ints, got {type(t).__name__}")
    med = tuple(sorted((int(s), int(e), str(d)) for s, e, d in media))
    for s, e, _ in med:
        if not 0 <= s < e <= len(toks):
            raise InvalidRequest(f"media range [{s}, {e}) outside [0, {len(toks)}]")
    return InputIdentity(toks, med, str(position_scheme), str(execution), _chain(toks, med))


def extend(ident: InputIdentity, more: Sequence[int]) -> InputIdentity:
    """The identity of `ident.tokens + more` reusing the full blocks already hashed."""
    toks = ident.tokens + tuple(more)
    full = len(ident.tokens) // BLOCK
    if full == 0:
        return identity_of(toks, ident.media, ident.position_scheme, ident.execution)
    # Re-chain from the last full block digest (its media ranges lie in the known tokens).
    out = ident.blocks + _chain(toks, ident.media, ident.blocks[-1], full * BLOCK)
    return InputIdentity(toks, ident.media, ident.position_scheme, ident.execution, out)


def from_frontier_identity(fi, execution: str = "") -> InputIdentity:
    """Map the frontend's `FrontierIdentity` (duck-typed; no import) onto an InputIdentity."""
    media = tuple((m.start, m.end, f"{getattr(m, 'kind', 'media')}:{m.digest}") for m in getattr(fi, "media", ()))
    return identity_of(fi.tokens, media, getattr(fi, "position_scheme", "linear"), execution)
