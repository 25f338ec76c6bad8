"""Every compiled step updates the pools in place: no copy of a whole pool leaf in its optimized
HLO, at every bucket (the smallest included) and for the speculative steps, the media variants
(prefill_media, decode_media, and the speculative prefill_spec_media, spec_decode_media,
spec_commit_media a vision Program warms up) and the pools' byte movers.

Donation alone does not show this (the outputs alias the donated inputs even when XLA copies
the pool inside the step first), so the compiled text itself is read (hlo_audit.pool_copies).
The pools have odd unit counts (2C+1 pages, C+3 slots) so that no other array of a step — a
mover's power-of-two bucket of units included — has a pool leaf's size.
"""
import jax
import pytest

from ledger import MAIN_KV, STATE_POOL
from ninfer_jax.config import ContextCacheConfig, EngineConfig
from ninfer_jax.model.hlo_audit import pool_converts, pool_copies
from ninfer_jax.program.calibrate import CostRates
from ninfer_jax.program.program import Program
from oracle_paths import oracle_dir

_RATES = CostRates(1e-4, 1e9, 1e9, 1e10)  # no calibration run: only the compiled text matters here


def _pool_leaves(program):
    return [(leaf.shape, leaf.dtype) for pool in program.stores.pools.values() for leaf in jax.tree.leaves(pool.tree)]


def _audit(program) -> dict:
    """{executable name: [whole pool leaf copies and converts]} for every step bucket and every
    byte mover."""
    leaves = _pool_leaves(program)

    def whole(exe):
        text = exe.as_text()
        return pool_copies(text, leaves) + pool_converts(text, leaves)

    found = {}
    for bucket, exe in program.steps._executables.items():
        found[f"{bucket[0]}{bucket[1:]}"] = whole(exe)
    for pool_id, pool in program.stores.pools.items():
        for (mover, b), exe in pool._executables.items():
            found[f"{pool_id}.{mover}[{b}]"] = whole(exe)
    return found


def _warm(model, model_name, c, spec=0, dtype="auto"):
    config = EngineConfig(model=model_name, dtype=dtype, max_concurrency=c, max_context=192, kv_capacity=(2 * c + 1) * 64,
                          chunk_size=32, speculative_tokens=spec, progress=False,
                          context_cache=ContextCacheConfig(device_state_slots=3, host_capacity_bytes=0))
    program = Program(config, model=model)
    program.cost_model = _RATES
    program.warmup()
    return program


@pytest.mark.parametrize("spec", [0, 2])
def test_every_builtin_step_updates_its_pools_in_place(builtin_model, spec):
    program = _warm(builtin_model, "builtin:tiny-hybrid", 4, spec)
    found = _audit(program)
    kinds = {name.split("(")[0] for name in found}
    expected = {"spec_decode", "spec_commit", "prefill_spec"} if spec else {"decode", "prefill"}
    assert expected <= kinds, kinds
    decode = "spec_decode" if spec else "decode"
    assert sum(name.startswith(decode + "(") for name in found) == len(program.decode_buckets) == 2, found  # buckets 2 and 4
    copies = {name: c for name, c in found.items() if c}
    assert not copies, f"steps copying a whole pool leaf: {copies}"


def test_media_steps_update_their_pools_in_place(builtin_model):
    """The media variants (`CompiledSteps.prefill` with embeds / embed_rows / rope, `decode`
    with rope: their own executables) at every bucket the warm-up compiled, on the built-in
    model given an M-RoPE section."""
    import dataclasses

    import jax.numpy as jnp
    import numpy as np

    cfg = builtin_model.config
    third = cfg.rotary_dim // 6
    model = dataclasses.replace(builtin_model, config=dataclasses.replace(
        cfg, mrope_section=(cfg.rotary_dim // 2 - 2 * third, third, third), mrope_interleaved=True))
    program = _warm(model, "builtin:tiny-hybrid", 4)
    steps = program.steps
    kv, state = (jax.tree.map(jnp.zeros_like, program.stores.pools[k].tree) for k in (MAIN_KV, STATE_POOL))
    for bucket in [b for b in steps._executables if b[0] in ("prefill", "decode")]:
        if bucket[0] == "prefill":  # ("prefill", tokens, start, lengths, table, slots, static...)
            args = [np.zeros(s, np.int32) for s in bucket[1:6]]
            r, t = bucket[1]
            media = dict(embeds=np.zeros((r, t, cfg.hidden_size), np.float32), embed_rows=np.zeros((r, t), bool),
                         rope=np.zeros((3, r, t), np.int32))
            _, _, kv, state = steps.prefill(kv, state, *args, **dict(bucket[6:]), **media)
        else:  # ("decode", tokens, positions, table, slots)
            args = [np.zeros(s, np.int32) for s in bucket[1:5]]
            _, _, kv, state = steps.decode(kv, state, *args, rope=args[1])
    found = _audit(program)
    kinds = {name.split("(")[0] for name in found}
    assert {"prefill_media", "decode_media"} <= kinds, kinds
    assert sum(name.startswith("decode_media(") for name in found) == len(program.decode_buckets), found
    copies = {name: c for name, c in found.items() if c}
    assert not copies, f"steps copying a whole pool leaf: {copies}"


@pytest.mark.parametrize("spec", [0, 2])
def test_bf16_steps_update_their_packed_pools_in_place(spec):
    """bfloat16 pools on the "xla" path are stored packed (uint16 bits): XLA's CPU scatter of
    bfloat16 would convert the whole pool to float32 and back at every write."""
    import jax.numpy as jnp

    from ninfer_jax.model.model import load_model
    from pallas_kernels._common import PACKED

    program = _warm(load_model("builtin:tiny-hybrid", "bfloat16"), "builtin:tiny-hybrid", 4, spec, "bfloat16")
    dtypes = {leaf[1] for leaf in _pool_leaves(program)}
    assert dtypes == {PACKED, jnp.dtype(jnp.float32)}, dtypes  # float32: the recurrent states
    whole = {name: c for name, c in _audit(program).items() if c}
    assert not whole, f"steps copying or converting a whole pool leaf: {whole}"


def test_moe_steps_update_their_pools_in_place(oracle_models):
    model, _ = oracle_models["qwen3_next"]
    program = _warm(model, oracle_dir("qwen3_next"), 2)
    copies = {name: c for name, c in _audit(program).items() if c}
    assert not copies, f"steps copying a whole pool leaf: {copies}"


def test_the_audit_sees_a_pool_copy_and_one_row_steps_avoid_it():
    """The detector itself, on the pattern behind the decode-at-one-row copies: a one-row read
    of a pool feeding more than the row's own write. Written with plain indexing, XLA turns the
    read into a dynamic-slice fused into every consumer, and copies the pool; through
    page_copy's gather and scatter (two_or_more) it stays one gather, read before the write."""
    import jax.numpy as jnp

    from pallas_kernels import page_copy

    def plain(pool, i):
        old = pool[i]
        return pool.at[i].set(old * 2.0), jnp.tanh(old).sum()

    def kernels(pool, i):
        old = page_copy.gather(pool, i[None])
        return page_copy.scatter(pool, i[None], old * 2.0), jnp.tanh(old).sum()

    pool = jnp.zeros((37, 5, 3), jnp.float32)
    leaves = [((37, 5, 3), jnp.float32)]
    for fn, copies in ((plain, True), (kernels, False)):
        text = jax.jit(fn, donate_argnums=0).lower(pool, jnp.int32(0)).compile().as_text()
        assert bool(pool_copies(text, leaves)) == copies, (fn.__name__, text)


def test_the_audit_sees_a_bf16_scatter_convert_the_pool_and_packing_avoids_it():
    """XLA's CPU backend scatters bfloat16 through float32: the whole pool converted there and
    back. The same write into a packed pool (storage_dtype on "xla") converts nothing."""
    import jax.numpy as jnp

    from pallas_kernels import page_copy
    from pallas_kernels._common import storage_dtype

    for dtype, converts in ((jnp.bfloat16, True), (storage_dtype(jnp.bfloat16, "xla"), False)):
        pool = jnp.zeros((37, 5, 3), dtype)
        write = jax.jit(lambda p, i, v: page_copy.scatter(p, i, v), donate_argnums=0)
        text = write.lower(pool, jnp.array([1, 2]), jnp.ones((2, 5, 3), jnp.bfloat16)).compile().as_text()
        assert bool(pool_converts(text, [((37, 5, 3), dtype)])) == converts, (dtype, text)


@pytest.mark.parametrize("spec", [0, 2])
def test_a_vision_programs_warm_up_compiles_media_steps_in_place(builtin_model, spec, monkeypatch):
    """A Program whose model has a vision tower (`takes_media`) warms up the media executables
    for every row (text rows included), the speculative ones too: each updates its pools in
    place. The tower itself is not compiled here (a stand-in object marks the model as a VL one;
    its warm-up buckets are none: the tower's own compilation is test_engine_media's)."""
    import dataclasses

    monkeypatch.setattr(Program, "tower_buckets", lambda self: [])

    cfg = builtin_model.config
    third = cfg.rotary_dim // 6
    model = dataclasses.replace(builtin_model, vision=object(), config=dataclasses.replace(
        cfg, mrope_section=(cfg.rotary_dim // 2 - 2 * third, third, third), mrope_interleaved=True))
    program = _warm(model, "builtin:tiny-hybrid", 2, spec)
    assert program.takes_media
    found = _audit(program)
    kinds = {name.split("(")[0] for name in found}
    expected = {"prefill_spec_media", "spec_decode_media", "spec_commit_media"} if spec else \
        {"prefill_media", "decode_media"}
    assert expected <= kinds and not kinds & {"prefill", "decode", "prefill_spec", "spec_decode"}, kinds
    copies = {name: c for name, c in found.items() if c}
    assert not copies, f"steps copying a whole pool leaf: {copies}"
