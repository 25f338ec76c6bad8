"""The stores' byte movers: compiled for every power-of-two bucket up to each pool's size at
warm-up (nothing compiles mid-run, however many units a plan moves), one host copy each way
(D2H straight into the arena's bytes, H2D from a zero-copy view of them), and copies that stay
in flight until polled (TXN-1, TXN-2, SCH-9)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ledger as L
from ninfer_jax.compile_cache import CompileCounter
from ninfer_jax.program import ProgramStores, main_kv_pool, state_image_pool
from ninfer_jax.program import transfers as T
from ninfer_jax.program.unit_pool import pow2_pieces, pow2_upto

PAGES = 200  # > the old warm-up limit of 64 units


def _stores(pages=PAGES, slots=5, host_pages=None, warm=True):
    kv = main_kv_pool(pages, 1, 1, 2)  # 64 tokens x 1 head x 2 dims x (k, v): 1 KiB a page
    st = state_image_pool(slots, 2, 4, 6, 2, 3, 5, 7, dtype=jnp.bfloat16)
    host_pages = pages if host_pages is None else host_pages
    s = ProgramStores([kv, st], host_pages * kv.unit_bytes + slots * st.unit_bytes)
    if warm:
        for p in s.pools.values():
            p.warm_up()
    return s


def _fill(s, pool_id, seed):
    pool = s.pools[pool_id]
    rng = np.random.default_rng(seed)
    leaves = [jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype) for shape, dtype in pool._shapes]
    pool.replace(jax.tree_util.tree_unflatten(pool._treedef, leaves))


def _alloc(s, pool_id, n, holder="rec"):
    p = L.plan_allocate(s.state, pool_id, n, holder)
    s.commit(p)
    return [a[0] for a in p.proof.allocated], [a[2] for a in p.proof.allocated]


def _begin(s, oids, to, drop=False):
    p = L.plan_begin_transfer(s.state, L.TransferRequest(L.TxnKind.DEMOTION, "t", oids, to, drop))
    assert isinstance(p, L.Plan), p
    s.commit(p)
    return p.proof.generation


def _end(s, g):
    for step in (L.plan_complete, L.plan_publish):
        s.commit(step(s.state, g))
    s.check_integrity()


def test_pow2_pieces_and_buckets():
    assert pow2_pieces(63) == [32, 16, 8, 4, 2, 1] and pow2_pieces(64) == [64] and pow2_pieces(0) == []
    assert sum(pow2_pieces(150)) == 150 and pow2_upto(200) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert T.runs([0, 10, 20, 40, 50, 70], 10) == [(0, 3), (3, 5), (5, 6)]


def test_movers_compiled_for_every_bucket_up_to_the_pool_size():
    s = _stores()
    kv, st = s.pools[L.MAIN_KV], s.pools[L.STATE_POOL]
    built = {(m, b) for m, b, *_ in kv.compilations}
    assert {("pack", b) for b in pow2_upto(128)} <= built and {("unpack", b) for b in pow2_upto(128)} <= built
    assert {("copy", b) for b in pow2_upto(256)} <= built  # copies pad to the bucket above the size
    assert ("hidden", 1) in {(m, b) for m, b, *_ in st.compilations}
    assert kv.warm_up() == 0, "a second warm-up builds nothing"


@pytest.mark.parametrize("warm", [True, False], ids=["warmed", "cold"])
def test_large_read_back_after_warm_up_compiles_nothing(warm):
    """150 pages out to Host and back (pieces of 128, 16, 4, 2), a 130-page device copy, a
    4-StateImage round trip: with warm-up no XLA compilation at all; the control without it
    does compile (so the counter sees compiles when they happen)."""
    s = _stores(pages=PAGES if warm else PAGES + 1, warm=warm)  # the control's shapes are its own (JAX caches)
    _fill(s, L.MAIN_KV, 0)
    _fill(s, L.STATE_POOL, 1)
    oids, units = _alloc(s, L.MAIN_KV, 150)
    sids, sunits = _alloc(s, L.STATE_POOL, 4)
    want = s.pools[L.MAIN_KV].read_units(units) if warm else None
    swant = s.pools[L.STATE_POOL].read_units(sunits) if warm else None
    built = sum(len(p.compilations) for p in s.pools.values())
    with CompileCounter() as cc:
        g = _begin(s, oids + sids, L.HOST_MEDIUM, drop=True)
        s.commit(L.plan_submit(s.state, g))
        _end(s, g)
        _alloc(s, L.MAIN_KV, 45, "other")  # the freed units are reused
        g = _begin(s, oids + sids, L.DEVICE)
        s.commit(L.plan_submit(s.state, g))
        _end(s, g)
        back = [s.state.objects[o].device.location for o in oids]
        s.pools[L.MAIN_KV].copy_units(back[:130], back[:130])  # bucket 256, rewrites the same bytes
        got = s.pools[L.MAIN_KV].read_units(back)
        sgot = s.pools[L.STATE_POOL].read_units([s.state.objects[o].device.location for o in sids])
    if warm:
        assert cc.requests == 0, f"{cc.requests} XLA compilations after warm-up"
        assert sum(len(p.compilations) for p in s.pools.values()) == built
        assert np.array_equal(got, want) and np.array_equal(sgot, swant)
    else:
        assert cc.requests > 0 and sum(len(p.compilations) for p in s.pools.values()) > built


def test_one_host_copy_each_way(monkeypatch):
    """D2H: the only host copy writes the arena's own bytes, from the device's host buffer (CPU:
    the packed array itself, no staging); H2D: what goes to the device is a view of the arena
    region (no staging copy), each byte once."""
    s = _stores()
    _fill(s, L.MAIN_KV, 2)
    oids, units = _alloc(s, L.MAIN_KV, 37)
    want = s.pools[L.MAIN_KV].read_units(units)
    ub = s.pools[L.MAIN_KV].unit_bytes
    produced, copies, uploads = [], [], []
    to_host, to_device, copy = T.HostPath.to_host, T.HostPath.to_device, T.Transfers._copy
    monkeypatch.setattr(T.HostPath, "to_host", lambda self, x: produced.append(to_host(self, x)) or produced[-1])
    monkeypatch.setattr(T.HostPath, "to_device", lambda self, v: uploads.append(v) or to_device(self, v))
    monkeypatch.setattr(T.Transfers, "_copy", lambda self, d, src: copies.append((d, src)) or copy(self, d, src))
    before = dict(s.transfers.stats)
    g = _begin(s, oids, L.HOST_MEDIUM, drop=True)
    s.commit(L.plan_submit(s.state, g))
    _end(s, g)
    assert len(produced) == len(pow2_pieces(37))  # one packed array per power-of-two piece
    assert sum(d.nbytes for d, _ in copies) == 37 * ub == s.transfers.stats["d2h_host_bytes"] - before.get(
        "d2h_host_bytes", 0)
    for d, src in copies:
        assert np.shares_memory(d, s.arena.buf), "the D2H copy must land in the arena's bytes"
        ptr = src.__array_interface__["data"][0]
        assert any(a.unsafe_buffer_pointer() <= ptr < a.unsafe_buffer_pointer() + a.nbytes for a in produced), \
            "the D2H copy must read the device's host buffer itself (no staging copy)"
    for o, row in zip(oids, want):
        assert np.array_equal(s.arena.read(s.state.objects[o].host.location, ub), row)
    _alloc(s, L.MAIN_KV, 40, "other")
    g = _begin(s, oids, L.DEVICE)
    s.commit(L.plan_submit(s.state, g))
    _end(s, g)
    assert uploads and all(np.shares_memory(v, s.arena.buf) for v in uploads), "H2D reads the arena in place"
    assert sum(v.nbytes for v in uploads) == 37 * ub
    back = [s.state.objects[o].device.location for o in oids]
    assert np.array_equal(s.pools[L.MAIN_KV].read_units(back), want)


def test_cpu_host_path_uses_plain_host_memory():
    """Pinned memory is used only off CPU: on CPU a device array is host memory already."""
    path = T.HostPath(jax.devices()[0])
    assert path.mode == "cpu" and path.pinned is None
    x = jnp.arange(8, dtype=jnp.uint8)
    assert path.to_host(x) is x


def test_transaction_copies_stay_in_flight_until_polled_and_land_the_old_bytes():
    """A held D2H is not done after its held polls; the source units are overwritten meanwhile
    (as a later step would), yet the arena gets the bytes at submit time; a poll lands it."""
    s = _stores()
    _fill(s, L.MAIN_KV, 3)
    oids, units = _alloc(s, L.MAIN_KV, 5)
    want = s.pools[L.MAIN_KV].read_units(units)
    s.transfers.hold_polls = 2
    g = _begin(s, oids, L.HOST_MEDIUM, drop=True)
    s.commit(L.plan_submit(s.state, g))
    _fill(s, L.MAIN_KV, 4)  # the pool changes after the copy was dispatched
    for _ in range(2):
        assert s.poll() == 0 and not s.copies_done(g)
    for _ in range(1000):
        s.poll()
        if s.copies_done(g):
            break
        s.transfers.wait(g)
    assert s.copies_done(g)
    _end(s, g)
    ub = s.pools[L.MAIN_KV].unit_bytes
    for o, row in zip(oids, want):
        assert np.array_equal(s.arena.read(s.state.objects[o].host.location, ub), row)


def test_complete_lands_what_was_not_polled_and_the_guard_lands_plan_effects():
    """Committing `complete` lands the copies first (the ledger never hears "done" early); a
    plan's own D2H (a capture to Host) is read back correctly at once through the guard."""
    s = _stores()
    _fill(s, L.STATE_POOL, 5)
    sids, sunits = _alloc(s, L.STATE_POOL, 2)
    want = s.pools[L.STATE_POOL].read_units(sunits)
    s.transfers.hold_polls = 10 ** 6
    g = _begin(s, sids, L.HOST_MEDIUM)
    s.commit(L.plan_submit(s.state, g))
    assert not s.copies_done(g)
    _end(s, g)  # complete: lands now
    ub = s.pools[L.STATE_POOL].unit_bytes
    assert np.array_equal(s.arena.read(s.state.objects[sids[0]].host.location, ub), want[0])
    p = L.capture.plan_host_object(s.state, L.STATE_POOL, "cap", sunits[1])
    s.commit(p)
    off = p.proof.host_placed[0][1]
    assert s.transfers.in_flight(), "a plan's own D2H is dispatched, not waited for"
    assert np.array_equal(s.arena.read(off, ub), want[1])
    assert not s.transfers.in_flight()
