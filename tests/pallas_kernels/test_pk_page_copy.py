import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import page_copy


def _pool(seed=0, shape=(6, 4, 2, 8)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_gather_reference():
    pool = _pool()
    idx = np.array([4, -1, 0, 4], np.int32)
    got = np.asarray(jax.jit(page_copy.gather)(pool, idx))
    want = np.stack([pool[i] if i >= 0 else np.zeros_like(pool[0]) for i in idx])
    np.testing.assert_array_equal(got, want)


def test_scatter_reference_skips_negative():
    pool = _pool()
    vals = _pool(1, (3,) + pool.shape[1:])
    idx = np.array([5, -1, 2], np.int32)
    got = np.asarray(jax.jit(page_copy.scatter)(pool, idx, vals))
    want = pool.copy()
    for m, i in enumerate(idx):
        if i >= 0:
            want[i] = vals[m]
    np.testing.assert_array_equal(got, want)


def test_copy_reference_reads_before_writing():
    pool = _pool()
    src = np.array([0, 1, -1, 3], np.int32)
    dst = np.array([1, 2, 4, -1], np.int32)  # 0->1 and 1->2 chain: 2 gets the OLD row 1
    got = np.asarray(jax.jit(page_copy.copy)(pool, src, dst))
    want = pool.copy()
    want[1], want[2] = pool[0], pool[1]
    np.testing.assert_array_equal(got, want)


def test_generic_trailing_dims():
    pool = np.arange(5, dtype=np.float32)  # [N] with no trailing dims
    np.testing.assert_array_equal(np.asarray(page_copy.gather(pool, np.array([2, -3], np.int32))), [2.0, 0.0])


def test_validation_errors():
    pool = _pool()
    with pytest.raises(ValueError, match="backend"):
        page_copy.gather(pool, np.array([0], np.int32), backend="bogus")
    with pytest.raises(ValueError, match="idx"):
        page_copy.gather(pool, np.array([[0]], np.int32))
    with pytest.raises(ValueError, match="values"):
        page_copy.scatter(pool, np.array([0], np.int32), pool[:2])
    with pytest.raises(ValueError, match="dst"):
        page_copy.copy(pool, np.array([0, 1], np.int32), np.array([0], np.int32))
    with pytest.raises(ValueError, match="idx"):
        page_copy.gather(pool, np.array([0.0], np.float32))


def test_interpret_matches_reference():
    pool = _pool(4, (6, 3, 8))  # row size 24: blocks of 8
    idx = np.array([5, -1, 0], np.int32)
    vals = _pool(5, (3, 3, 8))
    src = np.array([0, 1, -1, 3], np.int32)
    dst = np.array([1, 2, 4, -1], np.int32)
    np.testing.assert_array_equal(np.asarray(page_copy.gather(pool, idx, backend="interpret")),
                                  np.asarray(page_copy.gather(pool, idx)))
    np.testing.assert_array_equal(np.asarray(page_copy.scatter(pool, idx, vals, backend="interpret")),
                                  np.asarray(page_copy.scatter(pool, idx, vals)))
    np.testing.assert_array_equal(np.asarray(page_copy.copy(pool, src, dst, backend="interpret")),
                                  np.asarray(page_copy.copy(pool, src, dst)))


def test_packed_pool_rows_read_as_bfloat16_and_copy_as_bits():
    """A packed pool's rows gather as bfloat16, scatter packs bfloat16 (or wider) values, and a
    copy moves the bits untouched (no numeric convert of uint16)."""
    from pallas_kernels._common import PACKED, unpacked

    values = jnp.asarray(np.random.default_rng(5).standard_normal((6, 3, 4)), jnp.bfloat16)
    pool = jax.lax.bitcast_convert_type(values, PACKED)
    got = page_copy.gather(pool, jnp.array([4, -1, 0], jnp.int32))
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got[0], np.float32), np.asarray(values[4], np.float32))
    assert not np.asarray(got[1], np.float32).any()
    written = page_copy.scatter(pool, jnp.array([1], jnp.int32), values[5:6].astype(jnp.float32))
    assert written.dtype == PACKED
    np.testing.assert_array_equal(np.asarray(unpacked(written)[1], np.float32), np.asarray(values[5], np.float32))
    copied = page_copy.copy(pool, jnp.array([2, 3], jnp.int32), jnp.array([0, 5], jnp.int32))
    np.testing.assert_array_equal(np.asarray(copied)[[0, 5]], np.asarray(pool)[[2, 3]])
