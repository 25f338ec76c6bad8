"""The engine's speculative decoding steps (issue 17): MTP drafts, the Verify unit, the commit.

The MTP layers' K/V are a backend KV pool of their own (RES-1, `MTP_POOL`: `{"k", "v"}`, per MTP
layer `[num_pages, PAGE_SIZE, Hkv, D]`, mtp_steps.init_mtp_pool), addressed through each row's
own MTP page table (`mtp_table`), its units reserved, captured, bound, demoted and reclaimed by
the ledger like Main KV pages. MTP index i — (main final hidden i, token i+1) — is stored at
slot i + 1 (mtp_steps.SLOT_SHIFT), so a context's MTP coverage has the Main KV's page count and
a row writes MTP K/V only at or past its frontier (its own tail page, copied on write like the
Main KV's). The row invariant between cycles, at execution frontier n (main KV 0..n-1, the state
after n-1, the continuation hidden of n-1 in the slot): MTP indices 0..n-2 are final (computed
from main hiddens), at slots 1..n-1 — the CKP-1 backend frontier of a point captured there.

- `prefill_spec`: a main prefill chunk, then the MTP layers over the chunk's indices start-1 ..
  end-2 (the first from the slot's continuation hidden, read before the chunk overwrites it):
  slots start..end-1, the chunk's own positions.
- `spec_decode`: per row, the CKP-3 bridge (index n-1 from the slot's continuation hidden and
  ledger[n]) then recursive greedy drafts d1..dk, then the Verify unit: the main model scores
  ledger[n], d1..dk at positions n..n+k in one step, keeping the state after each position
  (verify_step.py). Nothing is committed: the state slots are not written.
- `spec_commit`: after the host accepted `keep` drafts, the state after position n+keep and its
  hidden are written to the slot (keep_verified), and MTP indices n..n+keep-1 are rewritten from
  the verify step's main hiddens (the drafts' K/V there came from MTP hiddens). Anything written
  past the accepted prefix lies at or beyond the new frontier and is rewritten before it is read.
"""
from __future__ import annotations

import jax.numpy as jnp

from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.mtp_steps import mtp_chunk
from ninfer_jax.model.pools import check_decode_args, write_hidden_state
from ninfer_jax.model.steps import prefill_chunk
from ninfer_jax.model.verify_step import keep_verified, verify_step
from pallas_kernels import page_copy

MTP_POOL = "backend_kv:mtp"  # the ledger pool id of the MTP layers' K/V (RES-1 backend KV)


def prefill_spec(params, kv, state, mtp, tokens, start_pos, lengths, page_table, mtp_table, slots, *,
                 cfg: ModelConfig, merger, backend: str = "xla", embeds=None, embed_rows=None, rope=None,
                 mtp_rope=None, all_logits: bool = False):
    """`prefill_chunk`'s arguments plus the MTP pool and table; also writes the chunk's MTP K/V
    (slots start..end-1). A row starting at 0 writes slot 0 from a zero hidden: slot 0 is never
    read (SLOT_SHIFT). Returns (logits, hidden, kv, state, mtp); `all_logits`: every position's
    logits `[R, T, V]`, as `prefill_chunk` gives them (prompt logprobs).

    Media (issue 34, each None for text): `embeds`, `embed_rows`, `rope` as `prefill_chunk`
    takes them; the MTP layers take the same embeddings for their next tokens (the chunk's) and
    `mtp_rope` `[3, R, T]`, the rotary triples of their indices start-1 .. end-2."""
    lm = merger(params)
    prev = page_copy.gather(state["hidden"], jnp.where(start_pos > 0, slots, -1), backend=backend)
    logits, last, kv, state, final = prefill_chunk(params, kv, state, tokens, start_pos, lengths, page_table,
                                                   slots, cfg=cfg, backend=backend, merger=merger, with_final=True,
                                                   write_hidden=False, embeds=embeds, embed_rows=embed_rows,
                                                   rope=rope, all_logits=all_logits)
    hidden = jnp.concatenate([prev[:, None].astype(final.dtype), final[:, :-1]], axis=1)
    _, mtp = mtp_chunk(lm, mtp, hidden, tokens, start_pos - 1, lengths, mtp_table, cfg, backend, rope=mtp_rope,
                       embeds=embeds, embed_rows=embed_rows)
    state = write_hidden_state(state, slots, lengths, last, backend=backend, read=prev)  # in place after `prev`
    return logits, last, kv, state, mtp


def text_rotary(positions, delta, width: int):
    """Text rotary triples `[3, B, width]` of positions p .. p+width-1 shifted by `delta` (equal
    axes: bit-identical to the 1-D rotary of the shifted positions)."""
    if delta is None:
        return None
    pos = (positions + delta)[:, None] + jnp.arange(width)[None, :]
    return jnp.broadcast_to(pos[None], (3,) + pos.shape)


def spec_decode(params, kv, state, mtp, tokens, positions, page_table, mtp_table, slots, wanted, *, k: int,
                cfg: ModelConfig, merger, backend: str = "xla", delta=None):
    """tokens `[B]` ledger[n], positions `[B]` the frontier n, slots `[B]` (negative: padding row),
    wanted `[B]` drafts to verify per row (0..k; 0 verifies ledger[n] alone, a plain decode).

    Returns (logits `[B, k+1, V]` of positions n..n+k, drafts `[B, k]`, final `[B, k+1, H]`,
    verified states, kv, mtp). Rows write Main KV at n..n+wanted and MTP slots
    n..n+max(wanted,1)-1. `delta` `[B]` (a request with media): rotary minus cache position of
    the row's tokens (text after the prompt), for the MTP and Verify positions alike."""
    check_decode_args(kv, state, tokens, positions, page_table, slots, cfg)
    lm = merger(params)
    active = slots >= 0
    hidden = page_copy.gather(state["hidden"], slots, backend=backend)
    token, drafts = tokens, []
    for i in range(k):  # CKP-3: step 0 is the frontier−1 bridge, later steps recurse on MTP hiddens
        write = (active & ((i == 0) | (i < wanted))).astype(jnp.int32)
        out, mtp = mtp_chunk(lm, mtp, hidden[:, None], token[:, None], positions - 1 + i, write, mtp_table,
                              cfg, backend, rope=text_rotary(positions - 1 + i, delta, 1))
        hidden = out[:, 0]
        token = jnp.argmax(lm.logits(hidden), axis=-1).astype(jnp.int32)
        drafts.append(token)
    drafts = jnp.stack(drafts, axis=1)
    verify_tokens = jnp.concatenate([tokens[:, None], drafts], axis=1)
    lengths = jnp.where(active, wanted + 1, 0).astype(jnp.int32)
    logits, final, kv, verified = verify_step(params, kv, state, verify_tokens, positions, lengths, page_table,
                                              slots, cfg=cfg, backend=backend, merger=merger,
                                              rope=text_rotary(positions, delta, k + 1))
    return logits, drafts, final, verified, kv, mtp


def spec_commit(params, state, mtp, verified, final, drafts, positions, keep, mtp_table, slots, *,
                cfg: ModelConfig, merger, backend: str = "xla", delta=None):
    """Commit `keep[r]` accepted drafts of each row's Verify unit (keep <= wanted): the state after
    position n+keep into the slot, and MTP indices n..n+keep-1 from the main hiddens. Returns
    (state, mtp)."""
    lm = merger(params)
    state = keep_verified(state, slots, verified, final, keep, backend=backend)
    k = drafts.shape[1]
    lengths = jnp.where(slots >= 0, keep, 0).astype(jnp.int32)
    _, mtp = mtp_chunk(lm, mtp, final[:, :k], drafts, positions, lengths, mtp_table, cfg, backend,
                       rope=text_rotary(positions, delta, k))
    return state, mtp
