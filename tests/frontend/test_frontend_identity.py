"""Frontier identity for the prefix index: exact tokens, block digest chain, media (CKP-1, CKP-4, SH-7)."""
from __future__ import annotations

import pytest

from ninfer_jax.frontend import BLOCK_TOKENS, DigestChain, MediaRange


def test_ckp4_digest_chain_is_shared_by_common_blocks_and_exact_per_frontier():
    a = DigestChain(list(range(200)))
    b = DigestChain(list(range(150)) + [7] * 50)
    assert BLOCK_TOKENS == 64 and len(a.block_digests) == 3
    assert a.block_digests[:2] == b.block_digests[:2] and a.block_digests[2] != b.block_digests[2]
    ia, ib = a.identity(130), b.identity(130)
    assert ia.digest == ib.digest and ia.tokens == tuple(range(130)) and ia.block_digests == a.block_digests[:2]
    assert a.identity(129).digest != ia.digest and a.identity(128).digest != ia.digest
    assert a.identity(160).digest != b.identity(160).digest
    assert ia.next_position == 130 and ia.position_scheme == "linear"


def test_ckp4_matches_is_a_real_prefix_comparison():
    ident = DigestChain([5, 6, 7, 8]).identity(3)
    assert ident.matches([5, 6, 7]) and ident.matches([5, 6, 7, 99])
    assert not ident.matches([5, 6]) and not ident.matches([5, 6, 8, 8])
    assert DigestChain([1]).identity(0).matches([])


def test_sh7_media_ranges_are_part_of_identity_and_never_split():
    media = [MediaRange(2, 6, "img-a")]
    chain = DigestChain(list(range(10)), media)
    with pytest.raises(ValueError):
        chain.identity(4)
    full = chain.identity(8)
    assert full.media == tuple(media)
    assert full.matches(list(range(10)), media) and not full.matches(list(range(10)))
    assert not full.matches(list(range(10)), [MediaRange(2, 6, "img-b")])
    assert full.digest != DigestChain(list(range(10)), [MediaRange(2, 6, "img-b")]).identity(8).digest
    assert chain.identity(2).media == ()


def test_ckp1_every_rendered_frontier_carries_its_identity(frontend):
    p = frontend.render_chat([{"role": "system", "content": "s " * 100}, {"role": "user", "content": "hello world"}])
    frontiers = [p.recovery_position, p.typed_rewrite_point, *p.markers]
    for f in frontiers:
        assert f.identity.frontier == f.frontier and f.identity.tokens == p.token_ids[: f.frontier]
        assert f.identity.digest == p.identity(f.frontier).digest
        assert len(f.identity.block_digests) == f.frontier // 64
    assert p.save_opportunities == tuple(sorted({p.recovery_position.frontier, *(m.frontier for m in p.markers)}))
