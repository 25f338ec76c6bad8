"""Step functions over paged Main KV and StateImage slots (the pools: `pools.py`).

`prefill_chunk` runs a ragged chunk: R rows, each continuing its own request from its own
frontier `start_pos` with `lengths[r]` valid tokens (0 = padding row). `decode_step` runs one
token for each of B rows. The cache index of a token is its position in the request; by default
it is also its rotary position. With media (multimodal.py) they differ: both steps then take a
`rope` input (the rotary positions: M-RoPE triples in a chunk, `media_inputs.py`), and the
prefill takes the vision tower's tokens in place of the placeholders' embeddings (`embeds`,
`embed_rows`). Rows address their KV through `page_table` and their state through
`slots`; a negative slot (padding) reads zeros and writes nothing. A row whose `start_pos` is 0
starts from the zero state whatever its slot holds.

The steps run the model's nnx modules (`modules.HybridLM`, merged inside the jitted function
from the split made once at load): embedding, per-layer projections, outputs, feed-forward,
final norm and head are the modules' methods; only the paged token-mixer cores (conv with a
rolling state, chunked delta rule, paged attention) are the step's own. Arguments are checked
statically against the config (`pools.check_prefill_args`, `pools.check_decode_args`). The
jitted, bucketed form of every step is `compiled.CompiledSteps`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp

from ninfer_jax.model.config import LINEAR, ModelConfig
from ninfer_jax.model.pools import (
    check_arg,
    check_decode_args,
    check_prefill_args,
    check_prefill_media,
    read_state,
    set_layer,
    write_hidden_state,
    write_state,
)
from pallas_kernels import conv1d, gdn, page_copy, paged_attention

if TYPE_CHECKING:  # flax is imported only when a model is first used
    from ninfer_jax.model.modules import HybridLM, Merger

GDN_CHUNK = 64


def model_module(params, cfg: ModelConfig, merger: Merger | None) -> HybridLM:
    """The model inside a traced step: `merger(leaves)` (the nnx split made once at load), or,
    for a direct caller passing the params dict, a module built over it."""
    if merger is not None:
        return merger(params)
    from ninfer_jax.model.modules import HybridLM  # flax: imported when a step first traces

    return HybridLM(cfg, params)


def paged_attention_chunk(layer, h, positions, k_pages, v_pages, page_table, start_pos, lengths,
                          cfg: ModelConfig, backend: str, rope=None):
    """One gated-attention mixer over a ragged chunk: h `[R, T, H]` (normed), positions `[R, T]`
    (the rotary positions, unless `rope` `[3, R, T]` gives M-RoPE triples). Writes the chunk's
    K/V into the row's pages, then attends causally over them. Returns (out `[R, T, H]`,
    k_pages, v_pages)."""
    if rope is None:
        q, k, v, gate = layer.attention_project(h, positions)
    else:
        q, k, v, gate = layer.attention_project(h, rope, triples=True)
    k_pages, v_pages = paged_attention.write_kv(k_pages, v_pages, k, v, page_table, start_pos, lengths,
                                                backend=backend)
    o = paged_attention.prefill_attention(q, k_pages, v_pages, page_table, start_pos, lengths,
                                          scale=cfg.head_dim ** -0.5, backend=backend)
    return layer.attention_output(o, gate), k_pages, v_pages


def main_attention_chunk(layer, h, positions, kv, attn: int, page_table, start_pos, lengths,
                         cfg: ModelConfig, backend: str, rope=None):
    """`paged_attention_chunk` on Main KV's attention layer `attn`: returns (out, kv)."""
    h, k_pages, v_pages = paged_attention_chunk(layer, h, positions, kv["k"][attn], kv["v"][attn],
                                                page_table, start_pos, lengths, cfg, backend, rope)
    return h, set_layer(kv, attn, k_pages, v_pages)


def prefill_chunk(params, kv, state, tokens, start_pos, lengths, page_table, slots, *,
                  cfg: ModelConfig, backend: str = "xla", all_logits: bool = False,
                  merger: Merger | None = None, with_final: bool = False, write_hidden: bool = True,
                  embeds=None, embed_rows=None, rope=None, capture: tuple[int, ...] = ()):
    """tokens `[R, T]`, start_pos/lengths/slots `[R]`, page_table `[R, P]`; `params` the
    model's split leaves with their `merger`, or the params dict (merger None).

    Media (each None: as for text): `embeds` `[R, T, H]` replace the token embeddings where
    `embed_rows` `[R, T]` (bool) is set (the tower's tokens in the placeholders); `rope`
    `[3, R, T]` int are the attention layers' M-RoPE positions (the cache index stays
    `start_pos + t`).

    Returns (logits, hidden, kv, state): logits `[R, V]` at each row's last valid token (or
    `[R, T, V]` with all_logits), hidden `[R, H]` the continuation hidden of that token; with
    `with_final`, also the final-normed hidden of every position `[R, T, H]` (the MTP layers'
    input, spec_steps.py). `write_hidden=False` leaves the slots' continuation hidden to the
    caller (`write_hidden_state`). `capture` (target layer ids, a DFlash drafter's): the
    outputs of those layers `[R, T, n·H]` are returned last (`layer_outputs`).
    """
    check_prefill_args(kv, state, tokens, start_pos, lengths, page_table, slots, cfg)
    check_prefill_media(tokens, embeds, embed_rows, rope, cfg)
    lm = model_module(params, cfg, merger)
    r, t = tokens.shape
    valid = jnp.arange(t)[None, :] < lengths[:, None]  # [R, T]
    writes = jnp.where(lengths > 0, slots, -1)
    fresh = start_pos == 0
    positions = start_pos[:, None] + jnp.arange(t)[None, :]
    x = lm.embed_tokens(tokens)
    if embeds is not None:
        x = jnp.where(embed_rows[..., None], embeds.astype(x.dtype), x)
    lin = attn = 0
    outputs = {}
    for i, layer in enumerate(lm.layers):
        h = layer.mixer_norm(x)
        if layer.kind == LINEAR:
            conv_state, rec_state = read_state(state, lin, slots, fresh, backend, after=h)
            mixed, z, b, a = layer.gdn_project(h)
            mixed, conv_state = conv1d.causal_conv1d_prefill(mixed, conv_state, layer.conv[...], lengths,
                                                             backend=backend)
            q, k, v, g, beta = layer.gdn_gates(mixed, b, a)
            # Padding tokens must leave the recurrent state untouched: decay 1, no update.
            g = jnp.where(valid[..., None], g, 0.0)
            beta = jnp.where(valid[..., None], beta, 0.0)
            k = jnp.where(valid[..., None, None], k, 0.0)
            o, rec_state = gdn.chunk_gated_delta_rule(q, k, v, g, beta, rec_state, chunk_size=GDN_CHUNK,
                                                      backend=backend)
            h = layer.gdn_output(o, z)
            state = write_state(state, lin, writes, conv_state, rec_state, backend)
            lin += 1
        else:
            h, kv = main_attention_chunk(layer, h, positions, kv, attn, page_table, start_pos, lengths, cfg, backend,
                                         rope)
            attn += 1
        x = layer.feed_forward(x + h, valid)  # padding tokens run no expert
        if i in capture:
            outputs[i] = x
    final = lm.final_norm(x)  # [R, T, H]
    last = final[jnp.arange(r), jnp.maximum(lengths - 1, 0)]
    if write_hidden:
        state = write_hidden_state(state, slots, lengths, last, backend=backend)
    logits = lm.logits(final if all_logits else last)
    out = (logits, last, kv, state) + ((final,) if with_final else ())
    if capture:
        out += (layer_outputs(outputs, final, capture, len(lm.layers)),)
    return out


def layer_outputs(outputs: dict, final, capture: tuple[int, ...], num_layers: int):
    """`[..., n·H]`: the outputs of the `capture` layers, concatenated in its order, as
    transformers' `hidden_states[i + 1]` gives them: the last layer's is the final-normed
    hidden (a DFlash drafter's target features, dflash_steps.py)."""
    return jnp.concatenate([final if i == num_layers - 1 else outputs[i] for i in capture], axis=-1)


def decode_step(params, kv, state, tokens, positions, page_table, slots, *,
                cfg: ModelConfig, backend: str = "xla", merger: Merger | None = None, rope=None):
    """tokens/positions/slots `[B]`, page_table `[B, P]`; a row with a negative slot is padding.
    `params` as for `prefill_chunk`. `rope` `[B]` int: the rotary positions where they are not
    `positions` (a request after media: its cache position plus its delta, `media_inputs.py`);
    a decoded token is text, so its three M-RoPE axes are equal and one position is exact.

    Returns (logits `[B, V]`, hidden `[B, H]`, kv, state).
    """
    check_decode_args(kv, state, tokens, positions, page_table, slots, cfg)
    if rope is not None:
        check_arg("decode_step", "rope", rope, tuple(tokens.shape), int)
    lm = model_module(params, cfg, merger)
    active = slots >= 0
    fresh = positions == 0
    x = lm.embed_tokens(tokens)
    lin = attn = 0
    for layer in lm.layers:
        h = layer.mixer_norm(x)
        if layer.kind == LINEAR:
            conv_state, rec_state = read_state(state, lin, slots, fresh, backend, after=h)
            mixed, z, b, a = layer.gdn_project(h)
            mixed, conv_state = conv1d.causal_conv1d_update(mixed, conv_state, layer.conv[...], backend=backend)
            q, k, v, g, beta = layer.gdn_gates(mixed, b, a)
            o, rec_state = gdn.recurrent_gated_delta_rule_step(q, k, v, g, beta, rec_state, backend=backend)
            h = layer.gdn_output(o, z)
            state = write_state(state, lin, slots, conv_state, rec_state, backend)
            lin += 1
        else:
            q, k, v, gate = layer.attention_project(h, positions if rope is None else rope)
            k_pages, v_pages = paged_attention.write_kv(
                kv["k"][attn], kv["v"][attn], k[:, None], v[:, None], page_table, positions,
                active.astype(jnp.int32), backend=backend)
            o = paged_attention.decode_attention(q, k_pages, v_pages, page_table,
                                                 jnp.where(active, positions + 1, 0),
                                                 scale=cfg.head_dim ** -0.5, backend=backend)
            h = layer.attention_output(o, gate)
            kv = set_layer(kv, attn, k_pages, v_pages)
            attn += 1
        x = layer.feed_forward(x + h, active)  # padding rows run no expert
    final = lm.final_norm(x)
    state = dict(state, hidden=page_copy.scatter(state["hidden"], slots, final, backend=backend))
    return lm.logits(final), final, kv, state
