"""Asynchronous context transactions (TXN-1..3, SCH-9, SRC-5): a bind's read-back, a demotion
and a Snapshot's offload stay in flight across cycles while other requests keep decoding; a
request whose valuable source is blocked waits for it; a cancel before submit, in flight and
before publish follows TXN-2; a large read-back after warm-up compiles nothing. Every output
equals a cold engine's (the cache off, each request alone); integrity holds after every cycle;
nothing is held at the end.

Completion is made controllable with the test hooks: `stores.transfers.hold_polls` (a
transaction's copies report "not ready" for that many SCH-9 points, three per cycle) and
`reuse.txns.hold` (a transaction stays RESERVED / COMPLETED for that many points)."""
import numpy as np
import pytest

import ledger
from engine_helpers import assert_idle_and_empty, make_engine, run_until_done
from ninfer_jax import ContextCacheConfig, SamplingParams
from ninfer_jax.compile_cache import CompileCounter
from ninfer_jax.engine.request import DECODE, PAUSED
from ninfer_jax.engine.transactions import WAIT_REASONS, Transactions

HOST = ContextCacheConfig(host_capacity_bytes=4 << 20)
COLD = ContextCacheConfig(enabled=False)
HOLD = 4  # cycles a held transfer stays in flight
SP = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
SP_LONG = SamplingParams(temperature=0.8, top_k=40, seed=7, max_tokens=30, ignore_eos=True)


def _ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1000, n).tolist()


@pytest.fixture(scope="module")
def cold(tiny_model):
    """The reference: a cache-less engine, each request alone, uninterrupted."""
    engine = make_engine(tiny_model, max_concurrency=3, max_context=256, chunk_size=16, context_cache=COLD)
    memo = {}

    def run(prompt, sp):
        key = (tuple(prompt), sp)
        if key not in memo:
            h = engine.submit(prompt, sp)
            run_until_done(engine, [h], check_every_cycle=False)
            memo[key] = h.result().token_ids
        return memo[key]

    return run


def _engine(tiny_model, c=3, **kw):
    return make_engine(tiny_model, max_concurrency=c, max_context=256, chunk_size=16, context_cache=HOST, **kw)


def _step(engine, n=1):
    for _ in range(n):
        engine.step()
        engine.check_integrity()


def _until(engine, cond, limit=500):
    for _ in range(limit):
        if cond():
            return
        _step(engine)
    raise AssertionError("condition never reached")


def _req(engine, h):
    return engine.core.by_id.get(h.request_id)


def _txn(engine):
    return engine.program.state.transaction


def _demote_everything(engine) -> None:
    """Every cached object to the Host arena, its Device replica dropped (run to its end now)."""
    state = engine.program.state
    oids = sorted({o for c in engine.core.reuse.cache.checkpoints.values() for o in c.object_ids()
                   if state.objects[o].device is not None and state.objects[o].host is None})
    engine.core.reuse.apply(ledger.plan_begin_transfer(state, ledger.TransferRequest(
        ledger.TxnKind.DEMOTION, ("reclaim",), oids, ledger.HOST_MEDIUM, drop_source=True)))
    engine.core.reuse.drive_transaction()
    engine.check_integrity()
    assert all(engine.program.state.objects[o].device is None for o in oids)


def _check_equal_cold(cold, work, handles):
    for (p, sp), h in zip(work, handles):
        got = h.result()
        assert got.finish_reason == "length", got.error
        assert got.token_ids == cold(p, sp)


def _host_source(engine, cold, prompt):
    """Run `prompt` alone (its P point is captured), then push every cached object to Host."""
    h = engine.submit(prompt, SP)
    run_until_done(engine, [h])
    _check_equal_cold(cold, [(prompt, SP)], [h])
    _demote_everything(engine)


def _decoding(engine, seed=50, n=40):
    a = engine.submit(_ids(seed, n), SP_LONG)
    _until(engine, lambda: _req(engine, a) is not None and _req(engine, a).phase == DECODE)
    return a


def test_bind_read_back_in_flight_while_others_decode_and_src5_waits(tiny_model, cold):
    """B's source is on the Host only: its bind transaction stays in flight for HOLD cycles while
    A keeps decoding; B keeps its lane and is not resident yet. C, whose best source is the same
    point (blocked by that transaction), waits for it (SRC-5) instead of binding root."""
    e = _engine(tiny_model)
    x = _ids(1, 120)
    _host_source(e, cold, x)
    a = _decoding(e)
    e.program.stores.transfers.hold_polls = 3 * HOLD
    work = [(x + _ids(2, 30), SP), (x + _ids(3, 20), SP)]
    b, c = (e.submit(p, sp) for p, sp in work)
    out = []
    for _ in range(HOLD):
        _step(e)
        t = _txn(e)
        out.append(len(_req(e, a).output))
        assert t is not None and t.kind == ledger.TxnKind.BIND and t.phase == ledger.TxnPhase.SUBMITTED, t
        rb, rc = _req(e, b), _req(e, c)
        assert rb not in e.core.residents and rc not in e.core.residents
        assert e.core.reuse.txns.binding == rb.ticket and e.core.free_lanes() == 3 - 1 - 1
    assert out == sorted(set(out)) and len(out) == HOLD, f"A did not decode every cycle meanwhile: {out}"
    e.program.stores.transfers.hold_polls = 0
    run_until_done(e, [a, b, c])
    _check_equal_cold(cold, [(x[:0] + _ids(50, 40), SP_LONG)] + work, [a, b, c])
    assert b.result().usage.cached_tokens == 120
    assert c.result().usage.cached_tokens == 120, "C gave its blocked source up (SRC-5)"
    assert e.stats()["h2d_bytes"] > 0
    assert_idle_and_empty(e)


def test_snapshot_offload_in_flight_while_others_decode(tiny_model, cold):
    """B is paused by Snapshot: its offload (D2H) stays in flight for HOLD cycles, its Device
    units still held, while A decodes; then it lands, the units are free, B resumes exactly."""
    e = _engine(tiny_model, c=2)
    work = [(_ids(10, 60), SP_LONG), (_ids(11, 90), SP_LONG)]
    a, b = (e.submit(p, sp) for p, sp in work)
    _until(e, lambda: all(_req(e, h) is not None and _req(e, h).phase == DECODE and len(_req(e, h).output) >= 2
                          for h in (a, b)))
    e.program.stores.transfers.hold_polls = 3 * HOLD
    used = e.program.check_integrity().pools[ledger.MAIN_KV]["used"]
    assert e.core.pause(b.request_id, "snapshot")
    t = _txn(e)
    assert t is not None and t.kind == ledger.TxnKind.PAUSE and t.phase == ledger.TxnPhase.SUBMITTED
    assert e.program.check_integrity().pools[ledger.MAIN_KV]["used"] == used, "the units go only at publish"
    out = []
    for _ in range(HOLD - 1):
        _step(e)
        t = _txn(e)
        assert t is not None and t.kind == ledger.TxnKind.PAUSE, t
        assert _req(e, b).phase == PAUSED
        out.append(len(_req(e, a).output))
    assert out == sorted(set(out)), f"A did not decode every cycle meanwhile: {out}"
    _until(e, lambda: _txn(e) is None)
    assert e.program.check_integrity().pools[ledger.MAIN_KV]["used"] < used
    e.program.stores.transfers.hold_polls = 0
    run_until_done(e, [a, b])
    _check_equal_cold(cold, work, [a, b])
    s = e.stats()
    assert s["pauses_snapshot"] == 1 and s["resumes_snapshot"] == 1 and s["d2h_bytes"] > 0
    assert_idle_and_empty(e)


def test_demotion_in_flight_while_others_decode(tiny_model, cold):
    """A demotion (begun the way a reclamation begins one) stays in flight while A decodes; once
    published the content is Host-only and a later request reads it back exactly."""
    e = _engine(tiny_model)
    x = _ids(20, 100)
    first = e.submit(x, SP)
    run_until_done(e, [first])
    a = _decoding(e)
    e.program.stores.transfers.hold_polls = 3 * HOLD
    state = e.program.state
    oids = sorted({o for cp in e.core.reuse.cache.checkpoints.values() for o in cp.object_ids()
                   if state.objects[o].device is not None and not any(h[0] == "seq" for h in state.objects[o].holders)})
    e.core.reuse.apply(ledger.plan_begin_transfer(state, ledger.TransferRequest(
        ledger.TxnKind.DEMOTION, ("reclaim",), oids, ledger.HOST_MEDIUM, drop_source=True)))
    e.core.reuse.txns.adopt()  # as a reclamation's plan does (RCL-7)
    assert _txn(e).phase == ledger.TxnPhase.SUBMITTED
    e.check_integrity()
    out = []
    for _ in range(HOLD - 1):
        _step(e)
        assert _txn(e) is not None and _txn(e).kind == ledger.TxnKind.DEMOTION
        out.append(len(_req(e, a).output))
    assert out == sorted(set(out))
    _until(e, lambda: _txn(e) is None)
    assert all(e.program.state.objects[o].device is None for o in oids if o in e.program.state.objects)
    e.program.stores.transfers.hold_polls = 0
    b = e.submit(x + _ids(21, 10), SP)
    run_until_done(e, [a, b])
    _check_equal_cold(cold, [(_ids(50, 40), SP_LONG), (x + _ids(21, 10), SP)], [a, b])
    assert b.result().usage.cached_tokens == 100
    assert_idle_and_empty(e)


def test_pressure_with_every_transfer_held_equals_cold(tiny_model, cold):
    """A pressure load (C=3 over a Main KV one page above its minimum, one spare slot, a small
    Host arena, Snapshot pauses) with every transaction held in flight for two cycles: binds
    and offloads are seen in flight across cycles in which decoding went on; outputs equal cold."""
    e = make_engine(tiny_model, max_concurrency=3, max_context=256, chunk_size=16, kv_capacity=5 * 64,
                    pause_route="snapshot",
                    context_cache=ContextCacheConfig(device_state_slots=1, host_capacity_bytes=3 << 20))
    e.program.stores.transfers.hold_polls = 6
    base = _ids(30, 64)
    work = [(base + _ids(31 + i, 40 + 13 * i), SP if i % 2 else SP_LONG) for i in range(7)]
    handles = [e.submit(p, sp) for p, sp in work]
    seen = set()
    for _ in range(5000):
        if all(h.done() for h in handles):
            break
        t0, steps0 = _txn(e), e.stats()["decode_steps"]
        _step(e)
        t1 = _txn(e)
        if t0 is not None and t1 is not None and t0.generation == t1.generation and \
                e.stats()["decode_steps"] > steps0:
            seen.add(t1.kind)  # in flight across a whole cycle that decoded
    run_until_done(e, handles)
    _check_equal_cold(cold, work, handles)
    s = e.stats()
    assert s["pauses_snapshot"] > 0 and s["resumes_snapshot"] > 0, s
    assert ledger.TxnKind.PAUSE in seen, seen
    assert_idle_and_empty(e)


PHASES = {"before_submit": ledger.TxnPhase.RESERVED, "in_flight": ledger.TxnPhase.SUBMITTED,
          "before_publish": ledger.TxnPhase.COMPLETED}


def _hold_for(e, phase):
    """Hold the next transaction in `phase` (for long enough), its copies for HOLD cycles."""
    tx = e.core.reuse.txns
    e.program.stores.transfers.hold_polls = 3 * HOLD if phase == "in_flight" else 0
    tx.hold = {"submit": 10 ** 6 if phase == "before_submit" else 0,
               "publish": 10 ** 6 if phase == "before_publish" else 0}


def _release_holds(e):
    e.core.reuse.txns.hold = {"submit": 0, "publish": 0}
    e.core.reuse.txns._held = {"submit": 0, "publish": 0}
    e.program.stores.transfers.hold_polls = 0


def _cancel_and_check(e, victim, kind, phase):
    assert _txn(e).kind == kind and _txn(e).phase == PHASES[phase], _txn(e)
    victim.cancel()
    _step(e)
    t = _txn(e)
    if phase == "in_flight":  # TXN-2: the real copy is waited for; its completion reverts
        assert t is not None and t.phase == ledger.TxnPhase.CANCELLING, t
        _until(e, lambda: _txn(e) is None)
    else:  # before submit or after completion: reverted at once
        assert t is None, t
    assert victim.result().finish_reason == "cancelled"
    assert not e.program.state.permits or all(p.owner != ledger.seq_holder(_ticket(victim))
                                              for p in e.program.state.permits.values())


_TICKETS = {}


def _ticket(h):
    return _TICKETS[h.request_id]


@pytest.mark.parametrize("phase", list(PHASES))
def test_txn2_cancel_a_fresh_bind(tiny_model, cold, phase):
    e = _engine(tiny_model)
    x = _ids(40, 100)
    _host_source(e, cold, x)
    a = _decoding(e)
    _hold_for(e, phase)
    b = e.submit(x + _ids(41, 20), SP)
    _until(e, lambda: _txn(e) is not None and _txn(e).phase == PHASES[phase])
    _TICKETS[b.request_id] = _req(e, b).ticket
    _cancel_and_check(e, b, ledger.TxnKind.BIND, phase)
    _release_holds(e)
    c = e.submit(x + _ids(42, 20), SP)  # the source is still there, whole
    run_until_done(e, [a, c])
    _check_equal_cold(cold, [(_ids(50, 40), SP_LONG), (x + _ids(42, 20), SP)], [a, c])
    assert c.result().usage.cached_tokens == 100
    assert_idle_and_empty(e)


@pytest.mark.parametrize("phase", list(PHASES))
def test_txn2_cancel_a_paused_request_while_its_offload_runs(tiny_model, cold, phase):
    e = _engine(tiny_model, c=2)
    work = [(_ids(60, 50), SP_LONG), (_ids(61, 80), SP_LONG)]
    a, b = (e.submit(p, sp) for p, sp in work)
    _until(e, lambda: all(_req(e, h) is not None and _req(e, h).phase == DECODE for h in (a, b)))
    _TICKETS[b.request_id] = _req(e, b).ticket
    _hold_for(e, phase)
    assert e.core.pause(b.request_id, "snapshot")
    if phase == "before_publish":
        _until(e, lambda: _txn(e) is not None and _txn(e).phase == ledger.TxnPhase.COMPLETED)
    _cancel_and_check(e, b, ledger.TxnKind.PAUSE, phase)
    _release_holds(e)
    run_until_done(e, [a])
    _check_equal_cold(cold, work[:1], [a])
    assert b.result().token_ids == cold(*work[1])[:len(b.result().token_ids)]
    assert_idle_and_empty(e)


@pytest.mark.parametrize("phase", list(PHASES))
def test_txn2_cancel_a_resume_read_back_returns_the_recovery_permit(tiny_model, cold, phase):
    """A paused request's Snapshot is on the Host; its recovery bind takes the full recovery
    permit with the transfer (TXN-2); cancelled in any phase, the permit goes with it."""
    e = _engine(tiny_model, c=2)
    work = [(_ids(70, 30), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)), (_ids(71, 80), SP_LONG)]
    a, b = (e.submit(p, sp) for p, sp in work)
    _until(e, lambda: _req(e, b) is not None and _req(e, b).phase == DECODE)
    _TICKETS[b.request_id] = _req(e, b).ticket
    assert e.core.pause(b.request_id, "snapshot")
    e.core.reuse.drive_transaction()  # the offload lands now: the snapshot is on the Host
    e.check_integrity()
    _hold_for(e, phase)
    # A finishes (a capacity event): B's recovery starts its read-back
    _until(e, lambda: _txn(e) is not None and _txn(e).kind == ledger.TxnKind.BIND
           and _txn(e).phase == PHASES[phase])
    assert e.core.recovery_pending and e.core.reuse.txns.recovering and e.core.preempt.holder is None
    _cancel_and_check(e, b, ledger.TxnKind.BIND, phase)
    assert not e.core.recovery_pending
    _release_holds(e)
    run_until_done(e, [a])
    _check_equal_cold(cold, work[:1], [a])
    assert_idle_and_empty(e)


def test_resume_read_back_in_flight_then_exact(tiny_model, cold):
    """The same recovery read-back, held in flight for HOLD cycles, then run to the end: the
    resumed request continues exactly, the recovery permit ends on its first new token."""
    e = _engine(tiny_model, c=2)
    work = [(_ids(80, 30), SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)), (_ids(81, 90), SP_LONG),
            (_ids(82, 40), SP_LONG)]
    a, b = (e.submit(p, sp) for p, sp in work[:2])
    _until(e, lambda: _req(e, b) is not None and _req(e, b).phase == DECODE and len(_req(e, b).output) >= 3)
    assert e.core.pause(b.request_id, "snapshot")
    e.core.reuse.drive_transaction()
    c = e.submit(*work[2])
    e.program.stores.transfers.hold_polls = 3 * HOLD
    _until(e, lambda: _txn(e) is not None and _txn(e).kind == ledger.TxnKind.BIND)
    rc_out = []
    for _ in range(HOLD - 1):
        _step(e)
        assert _txn(e) is not None and _req(e, b).phase == PAUSED and e.core.recovery_pending
        rc = _req(e, c)
        rc_out.append(len(rc.output) if rc is not None else 0)
    e.program.stores.transfers.hold_polls = 0
    run_until_done(e, [a, b, c])
    _check_equal_cold(cold, work, [a, b, c])
    assert e.stats()["resumes_snapshot"] == 1 and not e.core.recovery_pending
    assert_idle_and_empty(e)


def test_wait_reasons_are_not_capacity_errors(tiny_model, cold):
    """Nothing resident, only a request waiting for its read-back: the engine neither reports the
    capacity contract error (RES-6) nor spins; the held copy ends after a bounded number of
    steps."""
    e = _engine(tiny_model, c=1)
    x = _ids(90, 100)
    _host_source(e, cold, x)
    e.program.stores.transfers.hold_polls = 3 * HOLD
    b = e.submit(x + _ids(91, 10), SP)
    _step(e)
    got = e.core._bind_fresh(_req(e, b)) if _txn(e) is not None else None
    assert got is not None and got.reason in WAIT_REASONS
    run_until_done(e, [b], max_cycles=50)
    _check_equal_cold(cold, [(x + _ids(91, 10), SP)], [b])
    assert e.stats()["capacity_errors"] == 0 and b.result().usage.cached_tokens == 100
    assert_idle_and_empty(e)


def test_large_snapshot_read_back_after_warm_up_compiles_nothing(tiny_model):
    """69 Main KV pages (more than the old 64-unit warm-up) out by Snapshot and back: no XLA
    compilation after warm-up, `compilations` unchanged, output equal to a cold engine's."""
    kw = dict(max_concurrency=1, max_context=72 * 64, kv_capacity=72 * 64, chunk_size=512)
    prompt, sp = _ids(99, 4400), SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    ref = make_engine(tiny_model, context_cache=COLD, **kw)
    h = ref.submit(prompt, sp)
    run_until_done(ref, [h], check_every_cycle=False)
    want = h.result().token_ids
    e = make_engine(tiny_model, context_cache=ContextCacheConfig(host_capacity_bytes=8 << 20), **kw)
    compiled = e.program.compilations
    h = e.submit(prompt, sp)
    _until(e, lambda: _req(e, h) is not None and _req(e, h).phase == DECODE and len(_req(e, h).output) >= 2)
    with CompileCounter() as cc:
        assert e.core.pause(h.request_id, "snapshot")
        # Land the offload now: a resume that finds its own offload still running cancels it
        # (the content stays on Device), and this test is about the read-back.
        e.core.reuse.drive_transaction()
        assert all(e.program.state.objects[o].device is None for o in e.core.reuse.cache.checkpoints[
            e.core.reuse.snapshot_of(_req(e, h).ticket)].object_ids())
        run_until_done(e, [h])
    assert h.result().token_ids == want
    s = e.stats()
    page = e.program.stores.pools[ledger.MAIN_KV].unit_bytes
    assert s["resumes_snapshot"] == 1 and s["h2d_bytes"] >= 69 * page, s
    assert cc.requests == 0, f"{cc.requests} XLA compilations after warm-up"
    assert e.program.compilations == compiled
    assert_idle_and_empty(e)


def _full_cache_engine(tiny_model, c=2):
    """Main KV just above its CFG-6 minimum, filled with cached histories, so every new page a
    request needs comes from a demotion to Host."""
    e = _engine(tiny_model, c=c, kv_capacity=512)
    for i in range(6):
        run_until_done(e, [e.submit(_ids(300 + i, 120), SP)])
    return e


def test_res4_a_demotion_whose_copy_landed_frees_room_within_the_reclamation(tiny_model, cold, monkeypatch):
    """RES-4: a demotion whose copies have already landed completes inside the reclamation
    that began it, so the plan it serves is retried at once with the room (State, then Main KV,
    in one admission); a copy held in flight leaves the room to a later SCH-9 point instead."""
    landed = []
    real = Transactions.land_demotion

    def spy(self):
        got = real(self)
        landed.append(got)
        return got
    monkeypatch.setattr(Transactions, "land_demotion", spy)
    cycles_taken = {}
    for hold in (0, 2):
        e = _full_cache_engine(tiny_model)
        landed.clear()
        e.program.stores.transfers.hold_polls = hold
        work = [(_ids(400 + k, 90), SP) for k in range(3)]
        hs = [e.submit(p, sp) for p, sp in work]
        cycles = run_until_done(e, hs)
        _check_equal_cold(cold, work, hs)
        assert landed, "admission on a full cache reclaimed by demotion"
        if hold:
            assert not any(landed), "a held copy is never completed inside the reclamation"
        else:
            assert all(landed), "an unheld demotion's copy lands at once on this backend"
        cycles_taken[hold] = cycles
        e.program.stores.transfers.hold_polls = 0
        assert_idle_and_empty(e)
    assert cycles_taken[0] < cycles_taken[2], f"landing at once saves cycles: {cycles_taken}"


def test_sch9_the_prefill_turn_applies_again_when_a_demotion_lands_after_decode(tiny_model, cold, monkeypatch):
    """SCH-9: a demotion held for one point lands after Control/Decode; the prefill turn that had
    no permit this cycle applies again there and runs its chunk in the same cycle."""
    e = _full_cache_engine(tiny_model)
    a = _decoding(e)
    e.program.stores.transfers.hold_polls = 1  # not ready after admission, ready after decode
    core = e.core
    refreshed = []
    real = core._refreshed_prefill

    def spy():
        before = core.counters["prefill_chunks"]
        got = real()
        refreshed.append((got is not None, before))
        return got
    monkeypatch.setattr(core, "_refreshed_prefill", spy)
    work = [(_ids(500, 150), SP)]
    b = e.submit(*work[0])
    ran = []
    while not b.done():
        n0 = len(refreshed)
        chunks = core.counters["prefill_chunks"]
        _step(e)
        if len(refreshed) > n0 and refreshed[-1][0]:
            ran.append(core.counters["prefill_chunks"] - chunks)
    run_until_done(e, [a])
    assert ran, "a prefill turn was refreshed after a demotion landed post-decode"
    assert all(n == 1 for n in ran), f"one chunk per cycle (SCH-1) in the refreshed cycles: {ran}"
    _check_equal_cold(cold, [(_ids(50, 40), SP_LONG)] + work, [a, b])
    e.program.stores.transfers.hold_polls = 0
    assert_idle_and_empty(e)


def test_sch9_reclamation_in_a_transaction_takes_what_costs_nothing(tiny_model, cold):
    """SCH-9, TXN-1: while a demotion holds the transaction slot, a decoding row that needs a
    page on a full Main KV takes one from content already replicated on the Host (a loss-free
    drop, RCL-1) and keeps decoding, instead of waiting for the transaction to end. Content
    with no Host copy is not deleted meanwhile."""
    e = _engine(tiny_model, c=2, kv_capacity=5 * 64)
    x, y = _ids(600, 120), _ids(601, 50)
    for p in (x, y):
        h = e.submit(p, SP)
        run_until_done(e, [h])
        _check_equal_cold(cold, [(p, SP)], [h])
    state = e.program.state
    cps = e.core.reuse.cache.checkpoints

    def cached_objects(prompt):
        return sorted({o for c in cps.values() if tuple(c.identity.tokens[:len(prompt)]) == tuple(prompt)[:c.frontier]
                       for o in c.object_ids() if state.objects[o].device is not None})
    xo, yo = cached_objects(x), cached_objects(y)
    assert xo and yo and not set(xo) & set(yo)
    # x's content replicated on the Host (its Device copies kept), the copy run to its end.
    e.core.reuse.apply(ledger.plan_begin_transfer(state, ledger.TransferRequest(
        ledger.TxnKind.DEMOTION, ("reclaim",), xo, ledger.HOST_MEDIUM, drop_source=False)))
    e.core.reuse.drive_transaction()
    e.check_integrity()
    assert all(e.program.state.objects[o].host is not None for o in xo)
    a = _decoding(e, seed=602, n=40)  # 40 + 30 tokens: its second page is needed at token 64
    free = e.program.check_integrity().pools[ledger.MAIN_KV]
    assert free["used"] == free["capacity"], f"Main KV is full before A crosses its page: {free}"
    # y's demotion holds the slot for many cycles.
    e.program.stores.transfers.hold_polls = 3 * 40
    e.core.reuse.apply(ledger.plan_begin_transfer(e.program.state, ledger.TransferRequest(
        ledger.TxnKind.DEMOTION, ("reclaim",), yo, ledger.HOST_MEDIUM, drop_source=True)))
    e.core.reuse.txns.adopt()
    out = []
    while not a.done():
        _step(e)
        if _txn(e) is None:
            break
        if _req(e, a) is not None:
            out.append(len(_req(e, a).output))
    assert _txn(e) is not None and a.done(), "A finished while the demotion was still in flight"
    assert out == sorted(set(out)), f"A decoded every cycle meanwhile: {out}"
    assert any(e.program.state.objects[o].device is None for o in xo if o in e.program.state.objects), \
        "a replicated page gave its Device copy up"
    assert all(e.program.state.objects[o].device is not None for o in yo), "nothing unreplicated was deleted"
    e.program.stores.transfers.hold_polls = 0
    _until(e, lambda: _txn(e) is None)
    _check_equal_cold(cold, [(_ids(602, 40), SP_LONG)], [a])
    assert_idle_and_empty(e)
