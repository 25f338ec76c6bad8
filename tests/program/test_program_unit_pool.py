"""UnitPool: a pytree of JAX arrays with a leading unit axis; unit bytes round-trip exactly."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import ledger as L
from ninfer_jax.program import UnitPool, main_kv_pool, state_image_pool


def _fill(pool: UnitPool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    leaves = []
    for shape, dtype in pool._shapes:
        leaves.append(jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype))
    import jax
    pool.replace(jax.tree_util.tree_unflatten(pool._treedef, leaves))


def test_main_kv_pool_shapes_and_unit_bytes():
    kv = main_kv_pool(num_pages=6, num_attention_layers=2, kv_heads=2, head_dim=4, dtype=jnp.bfloat16)
    assert kv.tree["k"][0].shape == (6, 64, 2, 4) and len(kv.tree["v"]) == 2
    assert kv.unit_bytes == 2 * 2 * 64 * 2 * 4 * 2  # layers × (k, v) × page × heads × dim × bf16
    assert kv.spec() == L.PoolSpec(L.MAIN_KV, L.KV_PAGES, 6, kv.unit_bytes, 64)


def test_state_image_pool_recurrent_is_float32():
    st = state_image_pool(slots=3, num_gdn_layers=2, conv_kernel=4, conv_dim=5, num_v_heads=2, head_k_dim=3,
                          head_v_dim=4, hidden=7, dtype=jnp.bfloat16)
    assert st.tree["recurrent"][1].dtype == jnp.float32 and st.tree["conv"][0].shape == (3, 3, 5)
    assert st.unit_bytes == 2 * (3 * 5 * 2 + 2 * 3 * 4 * 4) + 7 * 2


@pytest.mark.parametrize("units", [[0], [4, 1, 2], [5, 0, 3, 1, 2]])
def test_read_write_units_round_trip(units):
    st = state_image_pool(6, 2, 4, 5, 2, 3, 4, 7, dtype=jnp.bfloat16)
    _fill(st, 0)
    data = st.read_units(units)
    assert data.shape == (len(units), st.unit_bytes) and data.dtype == np.uint8
    before = [np.asarray(x) for x in jnp.asarray(st.tree["recurrent"][0])]
    other = [u for u in range(6) if u not in units]
    st.write_units(units[::-1], data[::-1])  # same bytes back to the same units
    assert np.array_equal(st.read_units(units), data)
    if other:
        assert np.array_equal(np.asarray(st.tree["recurrent"][0])[other], np.stack(before)[other])


def test_write_moves_whole_units_and_copy_units():
    kv = main_kv_pool(4, 1, 1, 2)
    _fill(kv, 1)
    k0 = np.asarray(kv.tree["k"][0])
    kv.write_units([3], kv.read_units([0]))
    assert np.array_equal(np.asarray(kv.tree["k"][0])[3], k0[0])
    kv.copy_units([1], [2])
    assert np.array_equal(np.asarray(kv.tree["v"][0])[2], np.asarray(kv.tree["v"][0])[1])


def test_replace_rejects_another_shape():
    kv = main_kv_pool(4, 1, 1, 2)
    with pytest.raises(ValueError):
        kv.replace({"k": (jnp.zeros((5, 64, 1, 2)),), "v": (jnp.zeros((5, 64, 1, 2)),)})
    with pytest.raises(ValueError):
        UnitPool("x", L.KV_PAGES, {"a": jnp.zeros((3, 2)), "b": jnp.zeros((4, 2))})
