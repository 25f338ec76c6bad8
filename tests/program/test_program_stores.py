"""ProgramStores: a committed plan moves the right bytes between Device pools and the Host
arena; a stale plan moves nothing (TXN-1, TXN-2, CFG-5, HOST-3, BIND-4)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ledger as L
from ninfer_jax.program import ProgramStores, main_kv_pool, state_image_pool


def _stores(pages=8, slots=3, host=None, dtype=jnp.float32):
    kv = main_kv_pool(pages, 2, 2, 4, dtype=dtype)
    st = state_image_pool(slots, 2, 4, 6, 2, 3, 5, 7, dtype=dtype)
    host = host if host is not None else 8 * kv.unit_bytes + 2 * st.unit_bytes
    return ProgramStores([kv, st], host)


def _write_random(stores, pool_id, units, seed):
    """What a model step would do: write real values into some units."""
    pool = stores.pools[pool_id]
    rng = np.random.default_rng(seed)
    leaves = jax.tree_util.tree_leaves(pool.tree)
    new = []
    for leaf in leaves:
        vals = rng.standard_normal((len(units),) + leaf.shape[1:]).astype(np.float32)
        new.append(leaf.at[jnp.asarray(units)].set(jnp.asarray(vals).astype(leaf.dtype)))
    pool.replace(jax.tree_util.tree_unflatten(pool._treedef, new))
    return pool.read_units(units)


def _alloc(stores, pool_id, n, holder="rec"):
    p = L.plan_allocate(stores.state, pool_id, n, holder)
    stores.commit(p)
    return [a[0] for a in p.proof.allocated], [a[2] for a in p.proof.allocated]


def _transfer(stores, oids, to, drop=False, group=64):
    p = L.plan_begin_transfer(stores.state, L.TransferRequest(L.TxnKind.DEMOTION, "t", oids, to, drop, group))
    assert isinstance(p, L.Plan), p
    stores.commit(p)
    g = p.proof.generation
    for step in (L.plan_submit, L.plan_complete, L.plan_publish):
        stores.commit(step(stores.state, g))
        stores.check_integrity()
    return p


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_d2h_then_h2d_round_trip_kv_pages(dtype):
    s = _stores(dtype=dtype)
    oids, units = _alloc(s, L.MAIN_KV, 3)
    want = _write_random(s, L.MAIN_KV, units, 0)
    _transfer(s, oids, L.HOST_MEDIUM, drop=True)  # Host demotion: Device pages freed
    unit = s.pools[L.MAIN_KV].unit_bytes
    for o, row in zip(oids, want):
        off = s.state.objects[o].host.location
        assert np.array_equal(s.arena.read(off, unit), row)
    # the freed Device pages get reused and overwritten by someone else
    others, ounits = _alloc(s, L.MAIN_KV, 8, "other")
    _write_random(s, L.MAIN_KV, ounits, 1)
    s.commit(L.plan_drop_holders(s.state, others[:4], "other"))
    _transfer(s, oids, L.DEVICE)  # bind back: new units, same bytes
    new_units = [s.state.objects[o].device.location for o in oids]
    assert np.array_equal(s.pools[L.MAIN_KV].read_units(new_units), want)


def test_state_image_round_trip_one_block():
    s = _stores()
    oids, units = _alloc(s, L.STATE_POOL, 2)
    want = _write_random(s, L.STATE_POOL, units, 2)
    p = _transfer(s, oids, L.HOST_MEDIUM, drop=True)
    assert len(p.proof.host_placed) == 2
    s.commit(L.plan_drop_holders(s.state, oids[:1], "rec"))
    _transfer(s, oids[1:], L.DEVICE)
    unit = s.state.objects[oids[1]].device.location
    assert np.array_equal(s.pools[L.STATE_POOL].read_units([unit]), want[1:])
    rec = s.pools[L.STATE_POOL].tree["recurrent"][0]
    assert rec.dtype == jnp.float32


def test_host3_fragmented_arena_bytes_land_at_each_pages_offset():
    page = main_kv_pool(1, 2, 2, 4).unit_bytes
    s = _stores(pages=8, host=8 * page)  # room for exactly 8 Host pages
    oids, units = _alloc(s, L.MAIN_KV, 8)
    _write_random(s, L.MAIN_KV, units, 3)
    _transfer(s, oids, L.HOST_MEDIUM, drop=True)
    s.commit(L.plan_drop_holders(s.state, [oids[i] for i in (1, 2, 5, 6)], "rec"))  # two 2-page holes
    new, nunits = _alloc(s, L.MAIN_KV, 4, "b")
    want = _write_random(s, L.MAIN_KV, nunits, 4)
    p = _transfer(s, new, L.HOST_MEDIUM, group=4)
    assert sorted(off for _, off in p.proof.host_placed) == [page, 2 * page, 5 * page, 6 * page]
    for o, row in zip(new, want):
        assert np.array_equal(s.arena.read(s.state.objects[o].host.location, page), row)


def test_bind4_copy_on_write_copies_the_device_unit():
    s = _stores()
    oids, units = _alloc(s, L.MAIN_KV, 1, "shared")
    want = _write_random(s, L.MAIN_KV, units, 5)
    p = L.plan_copy_on_write(s.state, oids[0], "branch")
    s.commit(p)
    (_, _, unit), = p.proof.allocated
    assert np.array_equal(s.pools[L.MAIN_KV].read_units([unit]), want)
    s.check_integrity()


def test_stale_plan_moves_no_bytes_and_keeps_the_state():
    s = _stores()
    oids, units = _alloc(s, L.MAIN_KV, 2)
    _write_random(s, L.MAIN_KV, units, 6)
    p = L.plan_begin_transfer(s.state, L.TransferRequest(L.TxnKind.PAUSE, "t", oids, L.HOST_MEDIUM))
    s.commit(p)
    g = p.proof.generation
    submit = L.plan_submit(s.state, g)  # planned, not committed ...
    s.commit(L.plan_cancel(s.state, g))  # ... the transaction is cancelled meanwhile
    arena_before = s.arena.buf.copy()
    state_before = s.state
    with pytest.raises(L.StalePlan):
        s.commit(submit)
    assert s.state is state_before and np.array_equal(s.arena.buf, arena_before)
    s.check_integrity()


def test_bad_plan_input_leaves_stores_unchanged():
    s = _stores()
    before = s.state
    with pytest.raises(L.InvalidRequest):
        s.commit(L.plan_allocate(s.state, L.MAIN_KV, 100, "x"))  # a Refusal is not a Plan
    with pytest.raises(L.ExceedsCapacity):
        L.plan_allocate(s.state, L.MAIN_KV, 10 ** 6, "x")
    assert s.state is before


def test_everything_free_at_the_end():
    s = _stores()
    oids, _ = _alloc(s, L.MAIN_KV, 3)
    sids, _ = _alloc(s, L.STATE_POOL, 1)
    _transfer(s, oids + sids, L.HOST_MEDIUM)
    s.commit(L.plan_drop_holders(s.state, oids + sids, "rec"))
    rc = s.check_integrity()
    assert rc.host_used_bytes == 0 and all(p["used"] == 0 for p in rc.pools.values()) and rc.objects == 0


def test_stores_integrity_catches_a_foreign_buffer():
    s = _stores()
    s.pools[L.MAIN_KV].capacity = 99  # a pool that no longer matches the ledger
    with pytest.raises(L.IntegrityError):
        s.check_integrity()
