"""DFlash over paged context (issue 35, dflash_steps.py): the target's layer outputs as the steps
capture them equal the whole-sequence forward's; context K/V appended chunk by chunk into a
paged pool, then a batch of blocks drafted against it, equals the drafter run on each row's
whole context at once (dflash.forward)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax.model import dflash
from ninfer_jax.model.dflash_steps import draft, init_dflash_pool, write_context
from ninfer_jax.model.pools import init_pools
from ninfer_jax.model.steps import prefill_chunk
from ninfer_jax.model.verify_step import verify_step

TOL = 2e-5  # float32: the chunked GDN and paged attention against the whole-sequence forward
CAPTURE = (0, 2, 3)  # the last layer included: its output is the final-normed hidden


def _drafter(cfg, seed=0):
    raw = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": cfg.hidden_size,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 96, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": cfg.vocab_size,
           "max_position_embeddings": 4096, "tie_word_embeddings": False,
           "dflash_config": {"mask_token_id": cfg.vocab_size - 1, "target_layer_ids": list(CAPTURE), "block_size": 4}}
    dcfg = dflash.parse_dflash_config(raw)
    dflash.check_drafter_fits(dcfg, cfg)
    rng = np.random.default_rng(seed)
    params = {"fc": rng.standard_normal((len(CAPTURE) * cfg.hidden_size, cfg.hidden_size)) / np.sqrt(3 * cfg.hidden_size),
              "hidden_norm": 1 + 0.1 * rng.standard_normal(cfg.hidden_size),
              "norm": 1 + 0.1 * rng.standard_normal(cfg.hidden_size), "layers": []}
    for _ in range(2):
        layer = {}
        for name, shape in {"q_proj": (64, 64), "k_proj": (64, 32), "v_proj": (64, 32), "o_proj": (64, 64),
                            "gate_proj": (64, 96), "up_proj": (64, 96), "down_proj": (96, 64)}.items():
            layer[name] = rng.standard_normal(shape) / np.sqrt(shape[0])
        for name, n in {"input_norm": 64, "post_norm": 64, "q_norm": 16, "k_norm": 16}.items():
            layer[name] = 1 + 0.1 * rng.standard_normal(n)
        params["layers"].append(layer)
    return dcfg, jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)


def _layer_outputs(model, tokens):
    """The whole-sequence forward's layer outputs (transformers' hidden_states[i + 1])."""
    lm = model.functional[0](model.functional[1])
    x = lm.embed_tokens(jnp.asarray(tokens))
    outs = []
    for layer in lm.layers:
        x = layer(x, jnp.arange(len(tokens)))
        outs.append(x)
    outs[-1] = lm.final_norm(x)
    return np.concatenate([np.asarray(outs[i]) for i in CAPTURE], axis=-1)


def _chunks(rows, chunk: int, dtype):
    """The rows (sequences of tokens or of feature vectors) cut into chunks of `chunk` positions:
    (the padded batch `[R, chunk, ...]`, each row's start, each row's valid length)."""
    for start in range(0, max(len(x) for x in rows), chunk):
        batch = np.zeros((len(rows), chunk) + np.shape(rows[0])[1:], dtype)
        lengths = np.zeros(len(rows), np.int32)
        for r, x in enumerate(rows):
            piece = x[start:start + chunk]
            batch[r, :len(piece)] = piece
            lengths[r] = len(piece)
        yield batch, np.array([min(start, len(x)) for x in rows], np.int32), lengths


def _prefill(model, seqs, tables, chunk):
    """Prefill each row in chunks of `chunk`, capturing; returns (kv, state, features per row)."""
    cfg = model.config
    merger, leaves = model.functional
    kv, state = init_pools(cfg, 8, 4, model.dtype)
    step = jax.jit(functools.partial(prefill_chunk, cfg=cfg, merger=merger, capture=CAPTURE))
    feats = [[] for _ in seqs]
    for tokens, starts, lengths in _chunks(seqs, chunk, np.int32):
        *_, kv, state, f = step(leaves, kv, state, jnp.asarray(tokens), jnp.asarray(starts), jnp.asarray(lengths),
                                jnp.asarray(tables), jnp.arange(len(seqs), dtype=jnp.int32))
        for r in range(len(seqs)):
            feats[r].append(np.asarray(f[r, :lengths[r]]))
    return kv, state, [np.concatenate(f) for f in feats]


def test_prefill_and_verify_capture_the_layer_outputs(builtin_model):
    model, cfg = builtin_model, builtin_model.config
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, cfg.vocab_size, n).astype(np.int32) for n in (70, 45)]
    tables = np.array([[0, 1], [2, 3]], np.int32)
    kv, state, feats = _prefill(model, [s[:-4] for s in seqs], tables, 32)
    for s, f in zip(seqs, feats):
        np.testing.assert_allclose(f, _layer_outputs(model, s)[:len(s) - 4], atol=TOL, rtol=0)
    # The Verify unit over the last 4 positions of each row captures them too.
    merger, leaves = model.functional
    tokens = jnp.asarray(np.stack([s[-4:] for s in seqs]))
    starts = jnp.asarray([len(s) - 4 for s in seqs], jnp.int32)
    *_, f = jax.jit(functools.partial(verify_step, cfg=cfg, merger=merger, capture=CAPTURE))(
        leaves, kv, state, tokens, starts, jnp.full(2, 4, jnp.int32), jnp.asarray(tables), jnp.arange(2, dtype=jnp.int32))
    for r, s in enumerate(seqs):
        np.testing.assert_allclose(np.asarray(f[r]), _layer_outputs(model, s)[-4:], atol=TOL, rtol=0)


@pytest.mark.parametrize("chunk", [24])
def test_paged_context_drafts_as_the_whole_context(builtin_model, chunk):
    model, cfg = builtin_model, builtin_model.config
    dcfg, dparams = _drafter(cfg)
    rng = np.random.default_rng(5)
    seqs = [rng.integers(0, cfg.vocab_size - 1, n).astype(np.int32) for n in (100, 37, 64)]
    tables = np.array([[5, 1], [0, 7], [3, 2]], np.int32)  # scattered pages; 100 crosses a page boundary
    *_, feats = _prefill(model, seqs, tables, chunk)
    pool = init_dflash_pool(dcfg, 8, jnp.float32)
    write = jax.jit(functools.partial(write_context, dparams, dcfg))
    for f, starts, lengths in _chunks(feats, chunk, np.float32):  # appended as the chunks come
        pool = write(pool, jnp.asarray(f), jnp.asarray(starts), jnp.asarray(lengths), jnp.asarray(tables))
    lm = model.functional[0](model.functional[1])
    nxt = rng.integers(0, cfg.vocab_size - 1, len(seqs)).astype(np.int32)
    last = jnp.asarray(nxt)  # ledger[n], the token after each context: the block's first
    n = jnp.asarray([len(s) for s in seqs], jnp.int32)
    drafts, logits = jax.jit(functools.partial(draft, dparams, dcfg, embed=lm.embed_tokens, logits_of=lm.logits))(
        pool, tokens=last, positions=n, table=jnp.asarray(tables))
    assert drafts.shape == (3, dcfg.block_size - 1)
    for r, s in enumerate(seqs):
        block = np.array([nxt[r]] + [dcfg.mask_token_id] * (dcfg.block_size - 1))
        hidden = dflash.forward(dparams, dcfg, jnp.asarray(feats[r]), jnp.arange(len(s), dtype=jnp.int32),
                                lm.embed_tokens(jnp.asarray(block)), jnp.arange(len(s), len(s) + dcfg.block_size))
        want = dflash.scale_logits(dcfg, lm.logits(hidden[1:]))
        np.testing.assert_allclose(np.asarray(logits[r]), np.asarray(want), atol=1e-4, rtol=0)
        np.testing.assert_array_equal(np.asarray(drafts[r]), np.argmax(np.asarray(want), axis=-1))


def test_spec_commit_appends_the_accepted_positions(builtin_model):
    """The engine's DFlash steps: a prefill with context append, a Verify unit of k = 3, commits
    of 2 and 0 accepted drafts; the context then drafts the next block as dflash.forward does
    over the whole committed sequence (prompt, ledger[n], the accepted drafts)."""
    from ninfer_jax.model import dflash_steps as ds

    model, cfg = builtin_model, builtin_model.config
    dcfg, dparams = _drafter(cfg, seed=4)
    merger, leaves = model.functional
    params = (leaves, dparams)
    rng = np.random.default_rng(8)
    seqs = [rng.integers(0, cfg.vocab_size - 1, n).astype(np.int32) for n in (50, 30)]
    tables = np.array([[0, 1], [2, 3]], np.int32)
    kv, state = init_pools(cfg, 4, 2, model.dtype)
    pool = init_dflash_pool(dcfg, 4, jnp.float32)
    tokens = np.zeros((2, 64), np.int32)
    for r, s in enumerate(seqs):
        tokens[r, :len(s)] = s
    common = dict(cfg=cfg, dcfg=dcfg, merger=merger)
    slots = jnp.arange(2, dtype=jnp.int32)
    *_, kv, state, pool = jax.jit(functools.partial(ds.prefill_spec, **common))(
        params, kv, state, pool, jnp.asarray(tokens), jnp.zeros(2, jnp.int32), jnp.asarray([50, 30], jnp.int32),
        jnp.asarray(tables), jnp.asarray(tables), slots)
    nxt = jnp.asarray([5, 6], jnp.int32)  # ledger[n]
    n = jnp.asarray([50, 30], jnp.int32)
    _, drafts, final, verified, kv, pool = jax.jit(functools.partial(ds.spec_decode, k=3, **common))(
        params, kv, state, pool, nxt, n, jnp.asarray(tables), jnp.asarray(tables), slots, jnp.full(2, 3, jnp.int32))
    keep = np.array([2, 0], np.int32)
    state, pool = jax.jit(functools.partial(ds.spec_commit, **common))(
        params, state, pool, verified, final, drafts, n, jnp.asarray(keep), jnp.asarray(tables), slots)
    committed = [np.concatenate([s, [int(nxt[r])], np.asarray(drafts[r, :keep[r]])]).astype(np.int32)
                 for r, s in enumerate(seqs)]
    lm = merger(leaves)
    after = jnp.asarray([9, 11], jnp.int32)
    got, logits = ds.draft(dparams, dcfg, pool, lm.embed_tokens, lm.logits, after,
                           jnp.asarray([len(c) for c in committed], jnp.int32), jnp.asarray(tables))
    for r, c in enumerate(committed):
        block = np.array([int(after[r])] + [dcfg.mask_token_id] * (dcfg.block_size - 1))
        hidden = dflash.forward(dparams, dcfg, jnp.asarray(_layer_outputs(model, c)), jnp.arange(len(c), dtype=jnp.int32),
                                lm.embed_tokens(jnp.asarray(block)), jnp.arange(len(c), len(c) + dcfg.block_size))
        want = dflash.scale_logits(dcfg, lm.logits(hidden[1:]))
        np.testing.assert_allclose(np.asarray(logits[r]), np.asarray(want), atol=1e-4, rtol=0)
