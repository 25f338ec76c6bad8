"""The main model's multi-position verify step for speculative decoding (issue 17, RES-1 Verify).

`verify_step` scores T = k+1 positions per row in one step — the committed token input next and
the k drafts, at the row's execution frontier onwards — and returns the GDN conv and recurrent
state after EACH position instead of writing the state slots. `keep_verified` then writes, per
row, the state after the last accepted position (and the continuation hidden there) into the
row's slot: the state ends at the accepted prefix exactly, never by an approximate rollback.

The GDN mixers advance one position at a time with the decode kernels (causal_conv1d_update,
recurrent_gated_delta_rule_step), so each kept state is the one `decode_step` would have left;
attention is the paged chunk attention of `prefill_chunk`. K/V written past the accepted prefix
lie beyond the new execution frontier and are rewritten before any step reads them.
"""
from __future__ import annotations

import jax.numpy as jnp

from ninfer_jax.model.config import LINEAR, ModelConfig
from ninfer_jax.model.pools import check_prefill_args, read_state
from ninfer_jax.model.steps import layer_outputs, main_attention_chunk, model_module
from pallas_kernels import conv1d, gdn, page_copy


def verify_step(params, kv, state, tokens, start_pos, lengths, page_table, slots, *, cfg: ModelConfig,
                backend: str = "xla", merger=None, rope=None, capture: tuple[int, ...] = ()):
    """tokens `[B, T]` (ledger[frontier] then the drafts), start_pos `[B]` the execution frontier,
    lengths `[B]` valid positions (0: padding row), page_table `[B, P]` into Main KV, slots `[B]`
    the rows' StateImage slots (read, not written). `params`/`merger` as for `prefill_chunk`;
    `rope` `[3, B, T]`: the positions' rotary triples (a request with media), None: the positions.

    Returns (logits `[B, T, V]`, final `[B, T, H]` (final-normed hidden per position), kv,
    verified) with verified = {"conv": per GDN layer `[B, T, K-1, C]`, "recurrent": per GDN
    layer `[B, T, Hv, Dk, Dv]` float32}: the state after each position. `capture` (a DFlash
    drafter's target layer ids): those layers' outputs `[B, T, n·H]` are returned last."""
    check_prefill_args(kv, state, tokens, start_pos, lengths, page_table, slots, cfg, where="verify_step")
    lm = model_module(params, cfg, merger)
    t_len = tokens.shape[1]
    positions = start_pos[:, None] + jnp.arange(t_len)[None, :]
    valid = jnp.arange(t_len)[None, :] < lengths[:, None]  # [B, T]: a padding row has length 0
    fresh = start_pos == 0
    x = lm.embed_tokens(tokens)
    convs, recs = [], []
    lin = attn = 0
    outputs = {}
    for i, layer in enumerate(lm.layers):
        h = layer.mixer_norm(x)
        if layer.kind == LINEAR:
            conv_state, rec_state = read_state(state, lin, slots, fresh, backend, after=h)
            mixed, z, b, a = layer.gdn_project(h)
            outs, conv_after, rec_after = [], [], []
            for t in range(t_len):  # one position at a time: the state after each is kept
                m, conv_state = conv1d.causal_conv1d_update(mixed[:, t], conv_state, layer.conv[...], backend=backend)
                q, k, v, g, beta = layer.gdn_gates(m, b[:, t], a[:, t])
                o, rec_state = gdn.recurrent_gated_delta_rule_step(q, k, v, g, beta, rec_state, backend=backend)
                outs.append(o)
                conv_after.append(conv_state)
                rec_after.append(rec_state)
            h = layer.gdn_output(jnp.stack(outs, axis=1), z)
            convs.append(jnp.stack(conv_after, axis=1))
            recs.append(jnp.stack(rec_after, axis=1))
            lin += 1
        else:
            h, kv = main_attention_chunk(layer, h, positions, kv, attn, page_table, start_pos, lengths, cfg, backend,
                                         rope)
            attn += 1
        x = layer.feed_forward(x + h, valid)  # padding runs no expert
        if i in capture:
            outputs[i] = x
    final = lm.final_norm(x)
    out = (lm.logits(final), final, kv, {"conv": tuple(convs), "recurrent": tuple(recs)})
    if capture:
        out += (layer_outputs(outputs, final, capture, len(lm.layers)),)
    return out


def keep_verified(state, slots, verified, final, keep, *, backend: str = "xla"):
    """Write into each row's slot the state after position `keep[r]` of its verify step (the
    last accepted one: accepted drafts a → keep a) and the final hidden there (the continuation
    hidden, CKP-3). slots `[B]` (negative: skipped), keep `[B]` in [0, T). Returns the state."""
    rows = jnp.arange(slots.shape[0])

    def put(pool, per_position):
        return page_copy.scatter(pool, slots, per_position[rows, keep], backend=backend)

    return dict(state, conv=tuple(put(p, v) for p, v in zip(state["conv"], verified["conv"])),
                recurrent=tuple(put(p, v) for p, v in zip(state["recurrent"], verified["recurrent"])),
                hidden=put(state["hidden"], final))
