"""Records, checkpoints, identity, shared entries (REC-1..9, CKP-1..4, SH-1, BIND-3)."""
from __future__ import annotations

from cache_helpers import L, capture, compute, end, make, points, served, start, toks
from ledger.outcomes import PrivateSaved, Retired, SharedSaved

INPUT, ANCHOR, END, SHARED = L.PointKind.INPUT, L.PointKind.ANCHOR, L.PointKind.END, L.PointKind.SHARED


def _one_turn(sim, req="a", n=150, out=(7, 8, 9), anchors=(), shared_at=None, session=None, kind="ResponseReplay"):
    t = toks(n)
    _, v = start(sim, req, t, session)
    for f in sorted(set(anchors) | ({shared_at} if shared_at else set())):
        v = compute(sim, v, t, f)
        if f in anchors:
            capture(sim, v, ANCHOR, shared=(f == shared_at))
        else:
            capture(sim, v, None, shared=True)
    v = compute(sim, v, t)
    capture(sim, v, INPUT, input_kind=kind)
    full = t + list(out)
    v = compute(sim, v, full, len(full) - 1)
    end(sim, v)
    return t, full


def test_rec1_record_keeps_one_end_one_input_point_and_at_most_four_anchors():
    sim = make()
    _one_turn(sim, anchors=(10, 20, 30, 40, 50, 60))
    (rec,) = sim.cache.records.values()
    assert rec.end is not None and rec.input_point is not None
    assert len(rec.anchors) == L.cache_state.MAX_ANCHORS
    assert [sim.cache.checkpoints[a].frontier for a in rec.anchors] == [30, 40, 50, 60]  # REC-9: oldest replaced


def test_rec2_end_serves_a_continuation_that_includes_the_last_output():
    sim = make()
    _, full = _one_turn(sim)
    best = served(sim, full + [1, 2, 3])[0]
    assert best.frontier == len(full) - 1 and best.takeover == L.Takeover.MOVE


def test_rec3_response_replay_point_serves_a_retry_of_the_same_input():
    sim = make()
    t, _ = _one_turn(sim, kind=L.InputKind.RESPONSE_REPLAY)
    best = served(sim, t)[0]  # the retry: same input, the deeper E no longer matches
    c = sim.cache.checkpoints[best.cid]
    assert c.kind == INPUT and c.input_kind == "ResponseReplay" and best.frontier == len(t)


def test_rec4_turn_closure_point_serves_a_new_user_turn_rewriting_the_open_turn():
    sim = make()
    t, full = _one_turn(sim, kind=L.InputKind.TURN_CLOSURE)
    rewritten = t + [900, 901] + [500] * 20  # the reasoning of the open turn is dropped
    best = served(sim, rewritten)[0]
    c = sim.cache.checkpoints[best.cid]
    assert c.input_kind == "TurnClosure" and best.frontier == len(t)
    assert best.takeover == L.Takeover.TAKEOVER_FORK and best.retired  # E is deeper and incompatible


def test_rec5_recovery_frontier_at_an_earlier_content_boundary_recomputes_the_closing():
    sim = make()
    t = toks(140)
    c_frontier = 130  # C: end of the user body; 130..140 is template closing
    _, v = start(sim, "a", t)
    v = compute(sim, v, t, c_frontier)
    capture(sim, v, INPUT)
    v = compute(sim, v, t)
    end(sim, v)
    best = served(sim, t + [5, 5])[0]
    assert best.frontier == len(t)  # E here is at len(t): no output
    retry = served(sim, t[:135] + [77])[0]  # the closing differs after a rewrite: C still serves
    assert retry.frontier == c_frontier and round(retry.cost) == len(t[:135]) + 1 - c_frontier


def test_rec6_raw_input_end_and_explicit_anchors_are_recovery_positions():
    sim = make()
    t, _ = _one_turn(sim, anchors=(64,), kind=L.InputKind.RAW)
    inp = [c for c in points(sim, INPUT)][0]
    assert inp.input_kind == "P"
    assert served(sim, t[:64] + [999] * 10)[0].frontier == 64


def test_rec7_input_point_follows_the_message_structure_not_the_shared_marker():
    sim = make()
    _one_turn(sim, shared_at=100)
    (rec,) = sim.cache.records.values()
    assert sim.cache.checkpoints[rec.input_point].frontier == 150
    (sh,) = points(sim, SHARED)
    assert sh.frontier == 100 and sh.owner[0] == "shared"


def test_rec8_a_failed_optional_save_changes_nothing_and_execution_goes_on():
    sim = make(slots=1, host=0)  # the writer's state takes the only slot
    t = toks(100)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t, 64)
    before = (sim.state, sim.cache)
    res = capture(sim, v, INPUT)
    assert isinstance(res, L.Refusal)
    assert (sim.state, sim.cache) == before  # nothing reserved, nothing changed
    v = compute(sim, v, t)  # the math boundary was executed all the same
    end(sim, v)
    assert v.frontier == 100


def test_rec9_deeper_end_carries_compatible_input_points_and_new_saves_retire_old_ones():
    sim = make()
    t, full = _one_turn(sim)
    nxt = full + [50, 51, 52]
    best = served(sim, nxt)[0]
    (rec,) = sim.cache.records.values()
    assert best.takeover == L.Takeover.MOVE and best.carried == (rec.input_point,)
    _, v = start(sim, "b", nxt)
    v = compute(sim, v, nxt)
    old = sim.cache.records[rec.rid].input_point
    res = capture(sim, v, INPUT)
    assert Retired(old) in res.outcome and old not in sim.cache.checkpoints
    assert sim.cache.records[rec.rid].input_point != old


def test_rec9_anchor_replacement_is_skipped_when_the_oldest_is_protected():
    sim = make()
    t = toks(200)
    _, v = start(sim, "a", t)
    for f in (10, 20, 30, 40):
        v = compute(sim, v, t, f)
        capture(sim, v, ANCHOR)
    rid = sim.cache.active["a"].rid
    oldest = sim.cache.records[rid].anchors[0]
    cand = [c for c in served(sim, toks(10) + [999]) if c.cid == oldest][0]
    sim.apply(L.plan_wait(sim.state, sim.cache, "w", cand, ticket=9))
    v = compute(sim, v, t, 50)
    res = capture(sim, v, ANCHOR)
    assert isinstance(res, L.Refusal) and res.reason == "anchor_limit"


def test_ckp1_checkpoint_holds_identity_frontier_state_and_typed_kv_coverage():
    sim = make()
    _one_turn(sim)
    (inp,) = points(sim, INPUT)
    assert inp.frontier == 150 and inp.identity.tokens == tuple(toks(150))
    (pool, pages), = inp.kv
    assert pool == L.MAIN_KV and len(pages) == 3  # ceil(150 / 64)
    for oid in inp.object_ids():
        assert inp.holder in sim.state.objects[oid].holders
    assert sim.state.objects[inp.state].kind == L.STATE_IMAGE


def test_ckp2_end_sits_at_the_execution_frontier_last_token_not_yet_input():
    sim = make()
    t, full = _one_turn(sim, out=(1, 2, 3, 4))
    (e,) = points(sim, END)
    assert e.frontier == len(full) - 1


def test_ckp3_exact_hit_needs_no_prefill_and_an_uncommitted_suffix_is_no_point():
    sim = make()
    t, _ = _one_turn(sim)
    best = served(sim, t)[0]
    assert best.frontier == len(t) and best.cost < 1  # copies only, no prefill
    assert all(c.frontier <= len(t) + 2 for c in points(sim))


def test_ckp4_digests_only_narrow_adoption_verifies_tokens_media_and_execution():
    sim = make()
    t, _ = _one_turn(sim)
    (inp,) = points(sim, INPUT)
    forged = L.InputIdentity(tuple(toks(150, 5000)), (), "linear", "", inp.identity.blocks)  # same digests
    q = L.query_sources(sim.state, sim.cache, L.SourceQuery("x", forged))
    assert [c.takeover for c in q] == [L.Takeover.ROOT]
    other_exec = L.identity_of(t, execution="mtp")
    assert [c.takeover for c in L.query_sources(sim.state, sim.cache, L.SourceQuery("x", other_exec))] == ["root"]
    with_media = L.identity_of(t, media=[(10, 20, "img")])
    assert [c.takeover for c in L.query_sources(sim.state, sim.cache, L.SourceQuery("x", with_media))][-1] == "root"
    assert all(c.frontier <= 10 for c in L.query_sources(sim.state, sim.cache, L.SourceQuery("x", with_media)))


def test_sh1_private_point_and_shared_entry_at_one_position_share_the_state_by_reference():
    sim = make()
    t = toks(130)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t)
    res = capture(sim, v, INPUT, shared=True)
    priv = [c for c in points(sim, INPUT)][0]
    sh = [c for c in points(sim, SHARED)][0]
    assert priv.state == sh.state
    assert sim.state.objects[priv.state].holders >= {priv.holder, sh.holder}
    assert len([o for o in res.outcome if isinstance(o, (PrivateSaved, SharedSaved))]) == 2


def test_bind3_points_of_one_history_share_one_kv_directory_without_copies():
    sim = make()
    t = toks(200)
    _, v = start(sim, "a", t)
    v = compute(sim, v, t, 100)
    pages_before = sim.state.pool(L.MAIN_KV).spec.capacity - len(sim.state.pool(L.MAIN_KV).free)
    capture(sim, v, INPUT)  # at a partial page: no KV copy, no tail copy
    pages_after = sim.state.pool(L.MAIN_KV).spec.capacity - len(sim.state.pool(L.MAIN_KV).free)
    assert pages_after == pages_before
    v = compute(sim, v, t)
    end(sim, v)
    inp, e = points(sim, INPUT)[0], points(sim, END)[0]
    assert dict(inp.kv)[L.MAIN_KV] == dict(e.kv)[L.MAIN_KV][:2]  # same page objects, own coverage


def test_ckp4_frontend_frontier_identity_maps_onto_the_ledger_identity():
    from ninfer_jax.frontend.identity import DigestChain, MediaRange

    tokens = toks(200)
    chain = DigestChain(tokens, media=[MediaRange(70, 90, "abc")])
    fi = chain.identity(150)
    ident = L.from_frontier_identity(fi, execution="tiny/f32")
    assert ident.tokens == fi.tokens and ident.frontier == 150 and ident.execution == "tiny/f32"
    assert ident.media == ((70, 90, "image:abc"),)
    whole = L.from_frontier_identity(chain.identity(200), execution="tiny/f32")
    assert ident.is_prefix_of(whole) and not ident.is_prefix_of(L.identity_of(tokens, execution="tiny/f32"))
