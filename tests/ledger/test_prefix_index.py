"""The prefix index (CKP-4, SRC-1, CFG-7) against a brute-force scan: many points in one block
(a shared system prompt, then short turns) are filed apart by their tails, and a query still
meets every indexed point whose identity is a prefix of its own, and only points on its path."""
import immutables
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import identity_of
from ledger import prefix_index as px
from ledger.identity import BLOCK

SYSTEM = list(range(100, 100 + BLOCK + 7))  # a block and a bit, shared by every identity


def _ident(tail, execution=""):
    return identity_of(SYSTEM[: BLOCK - 3] + list(tail), execution=execution)


tails = st.lists(st.integers(0, 3), min_size=0, max_size=BLOCK + 5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(tails, st.booleans()), min_size=1, max_size=25), tails, st.data())
def test_candidates_and_deepest_match_a_brute_force_scan(points, query_tail, data):
    index, idents = immutables.Map(), {}
    for cid, (tail, other_exec) in enumerate(points, 1):
        ident = _ident(tail, "x" if other_exec else "")
        idents[cid] = ident
        index = px.add(index, ident, cid)
    gone = data.draw(st.sets(st.sampled_from(sorted(idents))))
    for cid in gone:  # removals prune every emptied branch (CFG-7)
        index = px.remove(index, idents.pop(cid), cid)
    assert px.branches_empty(index) == []
    assert sorted(c for _, cids in px.entries(index) for c in cids) == sorted(idents)
    q = _ident(query_tail)
    on_path = {cid for cid, i in idents.items() if i.is_prefix_of(q)}
    cand = list(px.candidates(index, q))
    assert len(cand) == len(set(cand))
    assert on_path <= set(cand)  # nothing on the path is missed
    assert all(idents[c].tokens == q.tokens[:len(idents[c].tokens)] for c in cand)  # nothing off it
    for lim in (len(q.tokens), len(q.tokens) - 1):
        got = list(px.deepest(index, q, lim))
        assert [m for m, _ in got] == sorted({m for m, _ in got}, reverse=True)
        want = {len(idents[c].tokens) for c in cand if len(idents[c].tokens) <= lim}
        assert {m for m, _ in got} == want
    for cid, ident in idents.items():
        assert cid in px.same(index, ident)
        assert px.key_of(ident) in {k for k, cids in px.entries(index) if cid in cids}
    if not idents:
        assert len(index) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**40), max_size=3 * BLOCK + 5), st.lists(st.integers(0, 2**40), max_size=2 * BLOCK + 3))
def test_extending_an_identity_hashes_the_same_digests_as_hashing_it_whole(head, more):
    """The engine extends a request's identity by its new outputs instead of rehashing the
    prompt (`ContextCache.identity(tokens, known)`): the digests the prefix index files points
    under must be the ones a cold hash of the same tokens gives (CKP-4)."""
    from ledger import extend
    whole = identity_of(head + more, execution="e")
    grown = extend(identity_of(head, execution="e"), more)
    assert grown == whole
    assert len(grown.blocks) == len(head + more) // BLOCK
