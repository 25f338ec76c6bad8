"""Token / position / media identity of a frontier, in the form the ledger's prefix index uses.

A prompt's tokens are cut into 64-token blocks (one Main KV page). Each full block gets a digest
chained on the previous one; a frontier's exact digest adds its partial tail and its length. The
digests only narrow candidates (CKP-4); adoption compares the exact `tokens` tuple, the position
scheme and the media ranges, which every `FrontierIdentity` carries.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Sequence

BLOCK_TOKENS = 64  # Main KV page size
_ROOT = hashlib.sha256(b"ninfer-jax/prefix-identity/v1").digest()


@dataclass(frozen=True)
class MediaRange:
    """Tokens [start, end) stand for one media item with content digest `digest` (SH-7)."""

    start: int
    end: int
    digest: str
    kind: str = "image"


def _pack(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}I", *tokens)


def _media_bytes(media: Sequence[MediaRange], lo: int, hi: int) -> bytes:
    parts = [f"{m.kind}:{m.start}:{m.end}:{m.digest};" for m in media if m.start < hi and m.end > lo]
    return "".join(parts).encode("utf-8")


@dataclass(frozen=True)
class FrontierIdentity:
    """Everything that identifies the input prefix [0, frontier) (CKP-1, CKP-4).

    `tokens` is the exact prefix; `block_digests[i]` covers tokens [0, 64*(i+1)); `digest`
    covers exactly [0, frontier). Positions are linear (position i holds token i), so the next
    position is `frontier`; `media` lists the media ranges inside the prefix (empty for text).
    """

    frontier: int
    tokens: tuple[int, ...] = field(repr=False)
    block_digests: tuple[bytes, ...] = field(repr=False)
    digest: bytes
    media: tuple[MediaRange, ...] = ()
    position_scheme: str = "linear"
    block_size: int = BLOCK_TOKENS

    def __repr__(self) -> str:
        return f"FrontierIdentity(frontier={self.frontier}, digest={self.digest.hex()[:16]}, media={len(self.media)})"

    @property
    def next_position(self) -> int:
        return self.frontier

    @property
    def hexdigest(self) -> str:
        return self.digest.hex()

    def matches(self, token_ids: Sequence[int], media: Sequence[MediaRange] = ()) -> bool:
        """A real prefix match (SH-7, CKP-4): same tokens and same media up to the frontier."""
        if len(token_ids) < self.frontier or tuple(token_ids[: self.frontier]) != self.tokens:
            return False
        theirs = tuple(m for m in media if m.start < self.frontier)
        return theirs == self.media


class DigestChain:
    """Block digests of one token sequence, computed once; slices out any frontier's identity."""

    def __init__(self, token_ids: Sequence[int], media: Sequence[MediaRange] = (), block_size: int = BLOCK_TOKENS):
        self.tokens = tuple(int(t) for t in token_ids)
        self.media = tuple(sorted(media, key=lambda m: (m.start, m.end)))
        self.block_size = block_size
        digests: list[bytes] = []
        prev = _ROOT
        for lo in range(0, len(self.tokens) - block_size + 1, block_size):
            hi = lo + block_size
            prev = hashlib.sha256(prev + b"B" + _pack(self.tokens[lo:hi]) + _media_bytes(self.media, lo, hi)).digest()
            digests.append(prev)
        self.block_digests = tuple(digests)

    def splits_media(self, frontier: int) -> bool:
        """True when `frontier` falls strictly inside a media range (never a valid frontier, SH-7)."""
        return any(m.start < frontier < m.end for m in self.media)

    def identity(self, frontier: int) -> FrontierIdentity:
        if not 0 <= frontier <= len(self.tokens):
            raise ValueError(f"frontier {frontier} outside [0, {len(self.tokens)}]")
        if self.splits_media(frontier):
            raise ValueError(f"frontier {frontier} splits a media range")
        full = frontier // self.block_size
        prev = self.block_digests[full - 1] if full else _ROOT
        lo = full * self.block_size
        tail = self.tokens[lo:frontier]
        digest = hashlib.sha256(prev + b"T" + _pack(tail) + _media_bytes(self.media, lo, frontier)
                                + struct.pack("<Q", frontier)).digest()
        return FrontierIdentity(
            frontier=frontier,
            tokens=self.tokens[:frontier],
            block_digests=self.block_digests[:full],
            digest=digest,
            media=tuple(m for m in self.media if m.start < frontier),
            block_size=self.block_size,
        )
