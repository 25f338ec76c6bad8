import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pk_naive
from pallas_kernels import paged_attention as pa

# page_size 4 so chunks cross page boundaries; GQA ratio 2.
N, PS, HKV, D, HQ, P = 12, 4, 2, 8, 4, 4


def _pools(rng, dtype=np.float32):
    k = rng.standard_normal((N, PS, HKV, D)).astype(dtype)
    v = rng.standard_normal((N, PS, HKV, D)).astype(dtype)
    return k, v


def _tables():
    # Disjoint, shuffled physical pages per row; page 0 belongs to nobody (it must stay intact).
    return np.array([[3, 7, 1, 9], [2, 11, 5, 4], [6, 8, 10, 0]], np.int32)


def test_write_kv_reference_matches_loop():
    rng = np.random.default_rng(0)
    kp, vp = _pools(rng)
    t = 6
    kn = rng.standard_normal((3, t, HKV, D)).astype(np.float32)
    vn = rng.standard_normal((3, t, HKV, D)).astype(np.float32)
    table = _tables()
    start = np.array([2, 5, 9], np.int32)  # row 0 crosses page 0->1, row 1 starts mid page
    lengths = np.array([6, 3, 0], np.int32)  # row 2 inactive: touches nothing, not page 0
    got = jax.jit(pa.write_kv)(kp, vp, kn, vn, table, start, lengths)
    want = pk_naive.write_kv(kp, vp, kn, vn, table, start, lengths)
    np.testing.assert_array_equal(np.asarray(got[0]), want[0])
    np.testing.assert_array_equal(np.asarray(got[1]), want[1])


def test_write_kv_casts_to_pool_dtype():
    rng = np.random.default_rng(1)
    kp, vp = (jnp.asarray(a, jnp.bfloat16) for a in _pools(rng))
    kn = rng.standard_normal((1, 2, HKV, D)).astype(np.float32)
    got_k, _ = pa.write_kv(kp, vp, kn, kn, _tables()[:1], np.array([0], np.int32), np.array([2], np.int32))
    assert got_k.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got_k[3, :2], np.float32),
                                  np.asarray(jnp.asarray(kn[0], jnp.bfloat16), np.float32))


def test_packed_pools_write_and_read_as_bfloat16():
    """A packed pool (uint16 bits of bfloat16, the "xla" path's storage) holds the same bits a
    bfloat16 pool would: writes and both attentions agree bit for bit."""
    from pallas_kernels._common import PACKED, storage_dtype, unpacked

    assert storage_dtype(jnp.bfloat16, "xla") == PACKED and storage_dtype(jnp.bfloat16, "pallas") == jnp.bfloat16
    assert storage_dtype(jnp.float32, "xla") == jnp.float32
    rng = np.random.default_rng(4)
    kp, vp = (jnp.asarray(a, jnp.bfloat16) for a in _pools(rng))
    packed = [jax.lax.bitcast_convert_type(x, PACKED) for x in (kp, vp)]
    kn = rng.standard_normal((3, 6, HKV, D)).astype(np.float32)
    args = (kn, -kn, _tables(), np.array([2, 5, 9], np.int32), np.array([6, 3, 0], np.int32))
    plain, packs = pa.write_kv(kp, vp, *args), pa.write_kv(*packed, *args)
    assert packs[0].dtype == PACKED
    for a, b in zip(plain, packs):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(unpacked(b), np.float32))
    q = rng.standard_normal((3, 5, HQ, D)).astype(np.float32)
    rows = (_tables(), np.array([0, 6, 3], np.int32), np.array([5, 4, 2], np.int32))
    np.testing.assert_array_equal(np.asarray(pa.prefill_attention(q, *plain, *rows, scale=0.3)),
                                  np.asarray(pa.prefill_attention(q, *packs, *rows, scale=0.3)))
    ctx = np.array([1, 13, 7], np.int32)
    np.testing.assert_array_equal(np.asarray(pa.decode_attention(q[:, 0], *plain, _tables(), ctx, scale=0.5)),
                                  np.asarray(pa.decode_attention(q[:, 0], *packs, _tables(), ctx, scale=0.5)))


def _attention_case(seed=2, t=5, start=(0, 6, 3), lengths=(5, 4, 0)):
    rng = np.random.default_rng(seed)
    kp, vp = _pools(rng)
    q = rng.standard_normal((3, t, HQ, D)).astype(np.float32)
    return q, kp, vp, _tables(), np.array(start, np.int32), np.array(lengths, np.int32)


def test_prefill_attention_reference_matches_loop():
    q, kp, vp, table, start, lengths = _attention_case()
    got = jax.jit(pa.prefill_attention, static_argnames="scale")(q, kp, vp, table, start, lengths, scale=0.3)
    want = pk_naive.prefill_attention(q, kp, vp, table, start, lengths, 0.3)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
    assert not np.asarray(got)[2].any() and not np.asarray(got)[1, 4:].any()


def test_decode_attention_reference_matches_loop():
    rng = np.random.default_rng(3)
    kp, vp = _pools(rng)
    q = rng.standard_normal((3, HQ, D)).astype(np.float32)
    ctx = np.array([1, 13, 0], np.int32)
    got = jax.jit(pa.decode_attention, static_argnames="scale")(q, kp, vp, _tables(), ctx, scale=0.5)
    want = pk_naive.decode_attention(q, kp, vp, _tables(), ctx, 0.5)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)


def test_validation_errors():
    q, kp, vp, table, start, lengths = _attention_case()
    with pytest.raises(ValueError, match="backend"):
        pa.prefill_attention(q, kp, vp, table, start, lengths, scale=1.0, backend="cuda")
    with pytest.raises(ValueError, match="q"):
        pa.prefill_attention(q[..., :3, :], kp, vp, table, start, lengths, scale=1.0)
    with pytest.raises(ValueError, match="page_table"):
        pa.prefill_attention(q, kp, vp, table[:2], start, lengths, scale=1.0)
    with pytest.raises(ValueError, match="v_pages"):
        pa.decode_attention(q[:, 0], kp, vp[:, :2], table, lengths, scale=1.0)
    with pytest.raises(ValueError, match="k_new"):
        pa.write_kv(kp, vp, q, q, table, start, lengths)
    with pytest.raises(ValueError, match="lengths"):
        pa.write_kv(kp, vp, kp[:3], vp[:3], table, start, lengths.astype(np.float32))


def test_interpret_write_kv_matches_reference():
    rng = np.random.default_rng(5)
    kp, vp = _pools(rng)
    kn = rng.standard_normal((3, 6, HKV, D)).astype(np.float32)
    vn = rng.standard_normal((3, 6, HKV, D)).astype(np.float32)
    args = (kp, vp, kn, vn, _tables(), np.array([2, 5, 9], np.int32), np.array([6, 3, 0], np.int32))
    got = pa.write_kv(*args, backend="interpret")
    want = pa.write_kv(*args)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


@pytest.mark.parametrize("t,start,lengths", [(5, (0, 6, 3), (5, 4, 0)), (11, (0, 5, 2), (11, 9, 1))])
def test_interpret_prefill_attention_matches_reference(t, start, lengths):
    # t = 11: two query blocks of 8 (GQA group 2 -> 16 rows), the second one partly padding.
    q, kp, vp, table, start, lengths = _attention_case(6, t, start, lengths)
    got = pa.prefill_attention(q, kp, vp, table, start, lengths, scale=0.3, backend="interpret")
    want = pa.prefill_attention(q, kp, vp, table, start, lengths, scale=0.3)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_interpret_decode_attention_matches_reference():
    rng = np.random.default_rng(7)
    kp, vp = _pools(rng)
    q = rng.standard_normal((3, HQ, D)).astype(np.float32)
    ctx = np.array([1, 13, 0], np.int32)
    got = pa.decode_attention(q, kp, vp, _tables(), ctx, scale=0.5, backend="interpret")
    want = pa.decode_attention(q, kp, vp, _tables(), ctx, scale=0.5)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
