"""A misshapen or mistyped step argument fails with a StepArgumentError naming it, not with an
XLA shape error, and costs no compilation."""
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.model.compiled import CompiledSteps

from ninfer_jax.model.pools import StepArgumentError, init_pools

from ninfer_jax.model.steps import decode_step, prefill_chunk

R, T, P = 2, 64, 4


@pytest.fixture(scope="module")
def own_steps(builtin_model):
    """Steps of their own: buckets are keyed by per-call shapes only, and these pools are not
    the shared fixture's."""
    return CompiledSteps(builtin_model, progress=False)


def _prefill_args(cfg, dtype):
    kv, state = init_pools(cfg, 8, 3, dtype)
    z = lambda *shape: jnp.zeros(shape, jnp.int32)  # noqa: E731
    return dict(kv=kv, state=state, tokens=z(R, T), start_pos=z(R), lengths=jnp.array([3, 0], jnp.int32),
                page_table=z(R, P), slots=jnp.array([0, -1], jnp.int32))


def _decode_args(cfg, dtype, b=1):
    kv, state = init_pools(cfg, 8, 3, dtype)
    z = lambda *shape: jnp.zeros(shape, jnp.int32)  # noqa: E731
    return dict(kv=kv, state=state, tokens=z(b), positions=z(b), page_table=z(b, P), slots=z(b))


def _prefill(steps, a):
    return steps.prefill(a["kv"], a["state"], a["tokens"], a["start_pos"], a["lengths"], a["page_table"], a["slots"])


def _decode(steps, a):
    return steps.decode(a["kv"], a["state"], a["tokens"], a["positions"], a["page_table"], a["slots"])


@pytest.mark.parametrize("name,value,match", [
    ("lengths", jnp.zeros((R + 1,), jnp.int32), "'lengths' of prefill_chunk"),
    ("page_table", jnp.zeros((R,), jnp.int32), "'page_table' of prefill_chunk"),
    ("tokens", jnp.zeros((T,), jnp.int32), "'tokens' of prefill_chunk: expected rank 2"),
    ("slots", jnp.zeros((R,), jnp.float32), "'slots' of prefill_chunk: expected an integer"),
])
def test_prefill_names_the_bad_argument(builtin_model, own_steps, name, value, match):
    args = _prefill_args(builtin_model.config, builtin_model.dtype)
    seen = len(own_steps.compilations)
    with pytest.raises(StepArgumentError, match=match):
        _prefill(own_steps, dict(args, **{name: value}))
    assert len(own_steps.compilations) == seen


def test_decode_cached_bucket_with_other_dtype_names_the_argument(builtin_model, own_steps):
    """Same shapes as a compiled bucket, other dtype: the executable refuses, the check names why."""
    cfg, dtype = builtin_model.config, builtin_model.dtype
    _decode(own_steps, _decode_args(cfg, dtype))  # compiles (or reuses) the b=1 bucket
    seen = len(own_steps.compilations)
    args = _decode_args(cfg, dtype)
    with pytest.raises(StepArgumentError, match="'positions' of decode_step: expected an integer"):
        _decode(own_steps, dict(args, positions=jnp.zeros((1,), jnp.float32)))
    assert len(own_steps.compilations) == seen


def test_pools_checked_against_the_config(builtin_model):
    cfg, dtype = builtin_model.config, builtin_model.dtype
    params = builtin_model.params
    args = _decode_args(cfg, dtype, b=2)
    kv, state = args["kv"], args["state"]
    bad_rec = dict(state, recurrent=tuple(x.astype(jnp.bfloat16) for x in state["recurrent"]))
    with pytest.raises(StepArgumentError, match=r"state\['recurrent'\]\[0\]"):
        decode_step(params, kv, bad_rec, args["tokens"], args["positions"], args["page_table"], args["slots"], cfg=cfg)
    short = {"k": kv["k"][:0], "v": kv["v"]}
    with pytest.raises(StepArgumentError, match="pool 'k' of decode_step: expected a tuple of 1"):
        decode_step(params, short, state, args["tokens"], args["positions"], args["page_table"], args["slots"], cfg=cfg)
    wrong_page = {"k": tuple(x[:, :32] for x in kv["k"]), "v": tuple(x[:, :32] for x in kv["v"])}
    with pytest.raises(StepArgumentError, match=r"kv\['k'\]\[0\]"):
        decode_step(params, wrong_page, state, args["tokens"], args["positions"], args["page_table"], args["slots"],
                    cfg=cfg)
    p = _prefill_args(cfg, dtype)
    with pytest.raises(StepArgumentError, match=r"state\['hidden'\]"):
        prefill_chunk(params, p["kv"], dict(p["state"], hidden=np.zeros((3, 7), np.float32)), p["tokens"],
                      p["start_pos"], p["lengths"], p["page_table"], p["slots"], cfg=cfg)


def test_well_formed_arguments_pass_the_checks(builtin_model):
    """The direct (unjitted, params-dict) entry runs with the same checks and the same results."""
    cfg = builtin_model.config
    a = _prefill_args(cfg, builtin_model.dtype)
    logits, hidden, _, _ = prefill_chunk(builtin_model.params, a["kv"], a["state"], a["tokens"], a["start_pos"],
                                         a["lengths"], a["page_table"], a["slots"], cfg=cfg)
    assert logits.shape == (R, cfg.vocab_size) and hidden.shape == (R, cfg.hidden_size)
    np.testing.assert_allclose(np.asarray(logits[0]), np.asarray(builtin_model.forward(np.zeros(3, np.int32)))[-1],
                               atol=1e-4, rtol=0)


def test_cached_bucket_with_other_pools_says_so(builtin_model, own_steps):
    cfg, dtype = builtin_model.config, builtin_model.dtype
    _decode(own_steps, _decode_args(cfg, dtype))
    kv, state = init_pools(cfg, 12, 3, dtype)  # more pages than the compiled bucket's pools
    with pytest.raises(StepArgumentError, match="pools of other shapes"):
        _decode(own_steps, dict(_decode_args(cfg, dtype), kv=kv, state=state))
