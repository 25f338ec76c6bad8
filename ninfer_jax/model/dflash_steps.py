"""DFlash drafting over paged context (issue 35, second piece): the drafter's context K/V as a
backend KV pool of its own, written from the target's layer outputs, and a batch of blocks
drafted against it.

The drafter (dflash.py) reads the target's hidden states at its `target_layer_ids`: the output
of target layer i (its residual stream after the layer, transformers' `hidden_states[i + 1]`; for
the last layer that is the final-normed hidden, as transformers returns it). The target steps
hand them out with `capture=` (`steps.prefill_chunk`, `verify_step.verify_step`): `features`
`[R, T, n·H]`, concatenated in `target_layer_ids` order.

Each position's context K/V depends on its own features and position only (`dflash.context_kv`),
so it is computed once, when the position's target hidden states exist, and kept:

- the pool (`init_dflash_pool`, id `DFLASH_POOL`): per drafter layer `{"k", "v"}` pages
  `[num_pages, PAGE_SIZE, Hkv, D]` of the drafter's geometry, stored as the Main KV is
  (`storage_dtype`), addressed by each row's own page table; position i at slot i, so a context
  covering positions 0..n-1 has the Main KV's page count (CKP-1: the drafter frontier of a point
  at n is n);
- `write_context` appends positions start..start+len-1 (a prefill chunk; the accepted positions
  of a Verify unit);
- `draft` runs one block per row, [ledger[n], mask × (block_size - 1)] at positions
  n..n+block_size-1, against the row's context 0..n-1, and returns the greedy drafts of
  positions n+1..n+block_size-1 with their logits (the target's head).

Drafts only choose what the Verify unit checks; they never become tokens unverified, so their
arithmetic need not be batch-invariant (doctrine 1 holds through the verification).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ninfer_jax.model import dflash
from ninfer_jax.model.pools import PAGE_SIZE
from ninfer_jax.model.spec_steps import text_rotary
from ninfer_jax.model.steps import prefill_chunk
from ninfer_jax.model.verify_step import keep_verified, verify_step
from pallas_kernels import paged_attention
from pallas_kernels._common import storage_dtype, unpacked

DFLASH_POOL = "backend_kv:dflash"  # the ledger pool id of the drafter's context K/V (RES-1 backend KV)


def init_dflash_pool(dcfg: dflash.DFlashConfig, num_pages: int, dtype, backend: str = "xla") -> dict:
    """Zeroed context K/V pages for every drafter layer, stored as `backend` keeps `dtype`."""
    shape = (num_pages, PAGE_SIZE, dcfg.num_key_value_heads, dcfg.head_dim)
    dt = storage_dtype(dtype, backend)
    n = dcfg.num_hidden_layers
    return {"k": tuple(jnp.zeros(shape, dt) for _ in range(n)), "v": tuple(jnp.zeros(shape, dt) for _ in range(n))}


def write_context(dparams: dict, dcfg: dflash.DFlashConfig, pool: dict, features, start_pos, lengths, table, *,
                  backend: str = "xla") -> dict:
    """Append context K/V for positions start_pos[r] .. start_pos[r]+lengths[r]-1 of each row from
    their target features `[R, T, n·H]` (position start_pos[r] + t at index t); table `[R, P]`
    the rows' drafter page tables. Returns the pool."""
    r, t = features.shape[:2]
    positions = start_pos[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
    ks, vs = dflash.context_kv(dparams, dcfg, features.reshape(r * t, -1), positions.reshape(-1))
    ks = ks.reshape(ks.shape[0], r, t, *ks.shape[2:])
    vs = vs.reshape(vs.shape[0], r, t, *vs.shape[2:])
    new_k, new_v = [], []
    for n in range(dcfg.num_hidden_layers):
        k_pages, v_pages = paged_attention.write_kv(pool["k"][n], pool["v"][n], ks[n], vs[n], table, start_pos,
                                                    lengths, backend=backend)
        new_k.append(k_pages)
        new_v.append(v_pages)
    return {"k": tuple(new_k), "v": tuple(new_v)}


def _row_context(pages, table):
    """`[R, P·PAGE_SIZE, Hkv, D]`: each row's context positions, in order, as numbers."""
    n, ps, hkv, d = pages.shape
    r, p = table.shape
    rows = pages[jnp.clip(table, 0, n - 1)]
    return unpacked(rows).reshape(r, p * ps, hkv, d)


def draft(dparams: dict, dcfg: dflash.DFlashConfig, pool: dict, embed, logits_of, tokens, positions, table):
    """One block per row: tokens `[R]` ledger[n], positions `[R]` the frontier n, table `[R, P]`
    (context 0..n-1 in the pool). `embed(ids)` and `logits_of(hidden)` are the TARGET's
    embedding and head (its logits then scaled as the drafter declares, `dflash.scale_logits`). Returns (drafts `[R, block_size-1]` int32, logits
    `[R, block_size-1, V]`): the greedy tokens of positions n+1 .. n+block_size-1."""
    bs = dcfg.block_size
    block = jnp.concatenate([tokens[:, None], jnp.full((tokens.shape[0], bs - 1), dcfg.mask_token_id, tokens.dtype)],
                            axis=1)
    block_pos = positions[:, None] + jnp.arange(bs, dtype=jnp.int32)[None, :]
    ctx_k = jnp.stack([_row_context(p, table) for p in pool["k"]], axis=1)  # [R, L, S, Hkv, D]
    ctx_v = jnp.stack([_row_context(p, table) for p in pool["v"]], axis=1)
    embeds = embed(block)

    def one(k, v, n, e, pos):
        return dflash.draft_block(dparams, dcfg, k.astype(e.dtype), v.astype(e.dtype), n, e, pos)

    hidden = jax.vmap(one)(ctx_k, ctx_v, positions, embeds, block_pos)  # [R, bs, H]
    logits = dflash.scale_logits(dcfg, logits_of(hidden[:, 1:]))
    return jnp.argmax(logits, axis=-1).astype(jnp.int32), logits


# ---- the engine's speculative steps with a DFlash drafter (the MTP ones' signatures) ------------
# `params` is (the target's split leaves, the drafter's params); `pool`/`table` the drafter's
# context pool and the rows' page tables into it (the MTP pool's place in spec_steps.py).

def prefill_spec(params, kv, state, pool, tokens, start_pos, lengths, page_table, table, slots, *, cfg, dcfg,
                 merger, backend: str = "xla", all_logits: bool = False, embeds=None, embed_rows=None, rope=None):
    """A main prefill chunk that also appends the chunk's positions to the drafter's context.
    Media (`embeds`, `embed_rows`, `rope` as `prefill_chunk` takes them) change the target's
    inputs and rotary positions only: the drafter ropes its context at cache positions (see
    `spec_decode`). Returns (logits, hidden, kv, state, pool)."""
    leaves, dparams = params
    logits, last, kv, state, features = prefill_chunk(leaves, kv, state, tokens, start_pos, lengths, page_table,
                                                      slots, cfg=cfg, backend=backend, merger=merger,
                                                      all_logits=all_logits, capture=dcfg.target_layer_ids,
                                                      embeds=embeds, embed_rows=embed_rows, rope=rope)
    pool = write_context(dparams, dcfg, pool, features, start_pos, lengths, table, backend=backend)
    return logits, last, kv, state, pool


def prefill_spec_media(params, kv, state, pool, tokens, start_pos, lengths, page_table, table, slots, embeds,
                       embed_rows, rope, mtp_rope, **kw):
    """`prefill_spec` with its media inputs positional, in the MTP media step's signature
    (`mtp_rope`, the MTP layers' rotary positions, has no use here)."""
    del mtp_rope
    return prefill_spec(params, kv, state, pool, tokens, start_pos, lengths, page_table, table, slots,
                        embeds=embeds, embed_rows=embed_rows, rope=rope, **kw)


def spec_decode(params, kv, state, pool, tokens, positions, page_table, table, slots, wanted, *, k: int, cfg, dcfg,
                merger, backend: str = "xla", delta=None):
    """tokens `[B]` ledger[n], positions `[B]` the frontier n (context 0..n-1 in the pool), wanted
    `[B]` drafts to verify (0..k). One block per row drafts d1..dk, then the Verify unit scores
    ledger[n], d1..dk at n..n+k. Nothing is committed. Returns (logits `[B, k+1, V]`, drafts
    `[B, k]`, final, verified (with the positions' target features under "features"), kv, pool).

    `delta` `[B]` (a request with media): the rows' rotary minus cache positions, for the
    Verify unit's target positions. The drafter has one rotary axis of its own and is given
    cache positions, context and block alike, as the reference drafts with its own position
    counter whatever the target's M-RoPE: its relative distances are those of the token
    sequence it reads."""
    leaves, dparams = params
    lm = merger(leaves)
    drafts, _ = draft(dparams, dcfg, pool, lm.embed_tokens, lm.logits, tokens, positions, table)
    drafts = drafts[:, :k]
    lengths = jnp.where(slots >= 0, wanted + 1, 0).astype(jnp.int32)
    logits, final, kv, verified, features = verify_step(leaves, kv, state, jnp.concatenate([tokens[:, None], drafts], 1),
                                                        positions, lengths, page_table, slots, cfg=cfg,
                                                        backend=backend, merger=merger,
                                                        capture=dcfg.target_layer_ids,
                                                        rope=text_rotary(positions, delta, k + 1))
    return logits, drafts, final, dict(verified, features=features), kv, pool


def spec_decode_media(params, kv, state, pool, tokens, positions, page_table, table, slots, wanted, delta, **kw):
    """`spec_decode` with the rows' rotary offsets `delta` positional."""
    return spec_decode(params, kv, state, pool, tokens, positions, page_table, table, slots, wanted, delta=delta, **kw)


def spec_commit(params, state, pool, verified, final, drafts, positions, keep, table, slots, *, cfg, dcfg, merger,
                backend: str = "xla"):
    """Commit `keep[r]` accepted drafts: the state after position n+keep into the slot, and the
    context of positions n..n+keep (ledger[n] and the accepted drafts) appended to the pool.
    Returns (state, pool)."""
    _, dparams = params
    state = keep_verified(state, slots, verified, final, keep, backend=backend)
    lengths = jnp.where(slots >= 0, keep + 1, 0).astype(jnp.int32)
    pool = write_context(dparams, dcfg, pool, verified["features"], positions, lengths, table, backend=backend)
    return state, pool


def spec_commit_media(params, state, pool, verified, final, drafts, positions, keep, table, slots, delta, **kw):
    """`spec_commit` in the MTP media step's signature: the context is kept at cache positions,
    so `delta` has no use here."""
    del delta
    return spec_commit(params, state, pool, verified, final, drafts, positions, keep, table, slots, **kw)
