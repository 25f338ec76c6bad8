"""The multi-position verify step (issue 17, RES-1 Verify) against `decode_step` token by token:
from the same prefilled pools, logits, final hiddens and the GDN conv and recurrent state after
every position agree within float32 noise; `keep_verified` leaves in each slot exactly the
state decode reaches at the kept position. Rows at different frontiers, one crossing the Main
KV page boundary (64), one shorter than T, and a padding row."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.model.pools import PAGE_SIZE, StepArgumentError, init_pools
from ninfer_jax.model.verify_step import keep_verified, verify_step

TOL = 1e-5  # float32; measured worst ~1e-6 (logits: chunk vs decode attention)
T = 5  # k = 4 drafts + the committed token
FRONTIERS = (3, 62, 40)  # 62..66 crosses the page boundary at 64
LENGTHS = (T, T, 3)
PAGES_PER_ROW = 2
SLOTS = (4, 1, 2)


def _case(model, steps):
    cfg = model.config
    rng = np.random.default_rng(11)
    seqs = [rng.integers(0, cfg.vocab_size, n + T).astype(np.int32) for n in FRONTIERS]
    tables = np.array([[6, 2], [0, 5], [3, 7]], np.int32)
    kv, state = init_pools(cfg, 8, 6, model.dtype)
    tokens = np.zeros((3, 64), np.int32)
    for i, (s, n) in enumerate(zip(seqs, FRONTIERS)):
        tokens[i, :n] = s[:n]
    _, _, kv, state = steps.prefill(kv, state, jnp.asarray(tokens), jnp.zeros(3, jnp.int32),
                                    jnp.asarray(FRONTIERS, jnp.int32), jnp.asarray(tables), jnp.asarray(SLOTS, jnp.int32))
    return seqs, tables, kv, state


def _copy(tree):
    return jax.tree.map(jnp.array, tree)


@pytest.mark.parametrize("which", ["builtin", "qwen3_next"])
def test_verify_states_equal_decode_token_by_token(which, builtin_model, builtin_steps, oracle_models):
    model, steps = (builtin_model, builtin_steps) if which == "builtin" else oracle_models[which]
    cfg = model.config
    seqs, tables, kv, state = _case(model, steps)
    merger, leaves = model.functional

    # Decode token by token (rows past their length are padding: slot -1).
    dkv, dstate = _copy(kv), _copy(state)
    want_logits, want_final, want_conv, want_rec = [], [], [], []
    for t in range(T):
        toks = [s[n + t] for s, n in zip(seqs, FRONTIERS)] + [0]
        slots = [sl if t < ln else -1 for sl, ln in zip(SLOTS, LENGTHS)] + [-1]
        logits, final, dkv, dstate = steps.decode(
            dkv, dstate, jnp.asarray(toks, jnp.int32), jnp.asarray([n + t for n in FRONTIERS] + [0], jnp.int32),
            jnp.asarray(np.concatenate([tables, tables[:1]])), jnp.asarray(slots, jnp.int32))
        want_logits.append(np.asarray(logits))
        want_final.append(np.asarray(final))
        idx = np.asarray(SLOTS)
        want_conv.append([np.asarray(c)[idx] for c in dstate["conv"]])
        want_rec.append([np.asarray(r)[idx] for r in dstate["recurrent"]])

    # One verify step over all T positions of every row, plus a padding row.
    tokens = np.zeros((4, T), np.int32)
    for i, (s, n) in enumerate(zip(seqs, FRONTIERS)):
        tokens[i] = s[n:n + T]
    step = jax.jit(functools.partial(verify_step, cfg=cfg, merger=merger), donate_argnums=(1,))
    logits, final, kv, verified = step(
        leaves, kv, state, jnp.asarray(tokens), jnp.asarray(FRONTIERS + (0,), jnp.int32),
        jnp.asarray(LENGTHS + (0,), jnp.int32), jnp.asarray(np.concatenate([tables, tables[:1]])),
        jnp.asarray(SLOTS + (-1,), jnp.int32))
    assert logits.shape == (4, T, cfg.vocab_size)
    for t in range(T):
        for i in range(3):
            if t >= LENGTHS[i]:
                continue
            np.testing.assert_allclose(logits[i, t], want_logits[t][i], atol=TOL, rtol=0)
            np.testing.assert_allclose(final[i, t], want_final[t][i], atol=TOL, rtol=0)
            for j in range(len(cfg.linear_layers)):
                np.testing.assert_allclose(verified["conv"][j][i, t], want_conv[t][j][i], atol=TOL, rtol=0)
                np.testing.assert_allclose(verified["recurrent"][j][i, t], want_rec[t][j][i], atol=TOL, rtol=0)

    # Keep positions 2, 4 and 0: each slot holds decode's state after that position.
    keep = np.array([2, 4, 0, 0])
    kept = keep_verified(_copy(state), jnp.asarray(SLOTS + (-1,), jnp.int32), verified, final, jnp.asarray(keep))
    for i, slot in enumerate(SLOTS):
        np.testing.assert_allclose(kept["hidden"][slot], want_final[keep[i]][i], atol=TOL, rtol=0)
        for j in range(len(cfg.linear_layers)):
            np.testing.assert_allclose(kept["conv"][j][slot], want_conv[keep[i]][j][i], atol=TOL, rtol=0)
            np.testing.assert_allclose(kept["recurrent"][j][slot], want_rec[keep[i]][j][i], atol=TOL, rtol=0)
    untouched = [s for s in range(6) if s not in SLOTS]
    for j in range(len(cfg.linear_layers)):
        np.testing.assert_array_equal(np.asarray(kept["recurrent"][j])[untouched],
                                      np.asarray(state["recurrent"][j])[untouched])


def test_verify_argument_checks(builtin_model):
    cfg = builtin_model.config
    kv, state = init_pools(cfg, 2, 2, builtin_model.dtype)
    merger, leaves = builtin_model.functional
    with pytest.raises(StepArgumentError, match="argument 'lengths' of verify_step"):
        verify_step(leaves, kv, state, jnp.zeros((2, T), jnp.int32), jnp.zeros(2, jnp.int32),
                    jnp.zeros(3, jnp.int32), jnp.zeros((2, 1), jnp.int32), jnp.zeros(2, jnp.int32),
                    cfg=cfg, merger=merger)
    assert PAGE_SIZE == 64  # FRONTIERS cross this boundary
