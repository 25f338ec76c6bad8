"""MTP draft steps over the MTP layers' own paged KV pool (issue 17).

Pool (a pytree of device arrays, donated to every step):
  mtp_kv = {"k": (per MTP layer) [num_pages, page_size, Hkv, D],  "v": same}
Its geometry (RES-1: `MTPPoolGeometry`, page size and bytes per token) is the MTP layers'; the
engine keeps these leaves inside the Main KV page units (spec_steps.py), addressed by the same
page table; Main KV itself is never touched here. Index i is stored at slot i + 1 of the row's
pages (`mtp_attention`); every argument below is in MTP indices.

MTP index t reads (main final-normed hidden t, token t+1) at position t, writes its K/V at t
and predicts token t+2 (the convention of `modules.MTPHead`). With the main model's execution
frontier n (main KV and state cover 0..n-1, ledger[n] is the committed token input next, CKP-2):
- `mtp_prefill` runs a ragged chunk of indices [start, start+len) per row from real main hiddens,
  so the MTP KV is valid on [0, n-1);
- `mtp_draft` starts at the bridge index n-1 — the continuation hidden at frontier−1 and
  ledger[n] (CKP-3) — and drafts k tokens greedily. Draft i+1 feeds the MTP output hidden of
  draft i (after `mtp.norm`) in place of a main hidden, as vLLM's recursive Qwen3-Next MTP does.
  Its K/V at n-1 is final; the K/V it writes at n..n+k-2 come from MTP hiddens and are
  rewritten by the next `mtp_prefill` over the accepted positions (with the verify step's main
  hiddens) before anything reads them.
Several MTP layers run in sequence at every index, as `MTPHead.__call__` does (published
Qwen3-Next / Qwen3.5 checkpoints have one).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model.pools import PAGE_SIZE, POOL, StepArgumentError, check_arg
from pallas_kernels import paged_attention
from pallas_kernels._common import storage_dtype

MAX_DRAFT = 4  # EngineConfig(speculative_tokens) is 0..4
SLOT_SHIFT = 1  # MTP index i is stored at page slot i + 1 (see `mtp_attention`)


@dataclasses.dataclass(frozen=True)
class MTPPoolGeometry:
    """What the ledger needs to size the MTP backend pool (RES-1)."""

    num_layers: int
    page_size: int
    kv_heads: int
    head_dim: int
    itemsize: int

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.kv_heads * self.head_dim * self.itemsize

    @property
    def page_bytes(self) -> int:
        return self.page_size * self.bytes_per_token


def mtp_pool_geometry(cfg: ModelConfig, dtype, page_size: int = PAGE_SIZE) -> MTPPoolGeometry:
    if not cfg.mtp_num_hidden_layers:
        raise ValueError("this model has no MTP layers (config mtp_num_hidden_layers is 0)")
    return MTPPoolGeometry(cfg.mtp_num_hidden_layers, page_size, cfg.num_key_value_heads, cfg.head_dim,
                           jnp.dtype(dtype).itemsize)


def init_mtp_pool(cfg: ModelConfig, num_pages: int, dtype, page_size: int = PAGE_SIZE, backend: str = "xla") -> dict:
    """Zeroed MTP KV pages, stored as `backend` keeps `dtype` (as `pools.init_pools`)."""
    g = mtp_pool_geometry(cfg, dtype, page_size)
    dtype = storage_dtype(dtype, backend)
    shape = (num_pages, g.page_size, g.kv_heads, g.head_dim)
    return {"k": tuple(jnp.zeros(shape, dtype) for _ in range(g.num_layers)),
            "v": tuple(jnp.zeros(shape, dtype) for _ in range(g.num_layers))}


# ---- argument checks (static: shapes and dtypes, at trace time) ----------------------------

def check_mtp_pool(pool, cfg: ModelConfig, where: str) -> None:
    n = cfg.mtp_num_hidden_layers
    for key in ("k", "v"):
        layers = pool.get(key) if isinstance(pool, dict) else None
        if not isinstance(layers, (tuple, list)) or len(layers) != n:
            raise StepArgumentError(f"pool {key!r} of {where}: expected a tuple of {n} arrays (one per MTP layer)")
    shape = (None, None, cfg.num_key_value_heads, cfg.head_dim)
    for i in range(n):
        check_arg(where, f"mtp_kv['k'][{i}]", pool["k"][i], shape, POOL)
        check_arg(where, f"mtp_kv['v'][{i}]", pool["v"][i], tuple(pool["k"][i].shape), POOL)


def check_mtp_prefill_args(pool, final, next_tokens, start_pos, lengths, page_table, cfg: ModelConfig) -> None:
    where = "mtp_prefill"
    check_arg(where, "next_tokens", next_tokens, rank=2, kind=int)
    r, t = next_tokens.shape
    check_arg(where, "final", final, (r, t, cfg.hidden_size), float)
    for name, x in (("start_pos", start_pos), ("lengths", lengths)):
        check_arg(where, name, x, (r,), int)
    check_arg(where, "page_table", page_table, (r, None), int)
    check_mtp_pool(pool, cfg, where)


def check_mtp_draft_args(pool, final, tokens, positions, page_table, cfg: ModelConfig) -> None:
    where = "mtp_draft"
    check_arg(where, "tokens", tokens, rank=1, kind=int)
    b = tokens.shape[0]
    check_arg(where, "final", final, (b, cfg.hidden_size), float)
    check_arg(where, "positions", positions, (b,), int)
    check_arg(where, "page_table", page_table, (b, None), int)
    check_mtp_pool(pool, cfg, where)


# ---- the steps -----------------------------------------------------------------------------

def mtp_chunk(lm, pool, final, next_tokens, start_pos, lengths, page_table, cfg, backend, *, rope=None,
              embeds=None, embed_rows=None):
    """MTP indices start_pos[r] + t, t < lengths[r]: final `[R, T, H]`, next_tokens `[R, T]` →
    (MTP output hidden `[R, T, H]` after mtp.norm, pool with their K/V written).

    Media (issue 34): `rope` `[3, R, T]` the indices' rotary triples (None: the indices), and
    `embeds` `[R, T, H]` in place of the next tokens' embeddings where `embed_rows` is set (the
    tower's tokens, as the main model takes them)."""
    head = lm.mtp
    positions = start_pos[:, None] + jnp.arange(next_tokens.shape[1])[None, :]
    valid = jnp.arange(next_tokens.shape[1])[None, :] < lengths[:, None]  # [R, T]
    emb = lm.embed_tokens(next_tokens)
    if embeds is not None:
        emb = jnp.where(embed_rows[..., None], embeds.astype(emb.dtype), emb)
    x = head.fuse(final, emb)
    ks, vs = list(pool["k"]), list(pool["v"])
    for i, layer in enumerate(head.layers):
        h, ks[i], vs[i] = mtp_attention(layer, layer.mixer_norm(x), positions, ks[i], vs[i], page_table,
                                        start_pos, lengths, cfg, backend, rope)
        x = layer.feed_forward(x + h, valid)  # padding runs no expert
    return head.out_norm(x), {"k": tuple(ks), "v": tuple(vs)}


def mtp_attention(layer, h, positions, k_pages, v_pages, page_table, start_pos, lengths, cfg, backend, rope=None):
    """The MTP layer's attention over its pages, index i stored at slot i + 1 (SLOT_SHIFT): RoPE
    at the index, causal over indices 0..i. The shift puts index i — (main hidden i, token i+1) —
    in the page of main position i+1, so the MTP K/V of a context ends where its Main KV ends
    and a row writes MTP K/V only at slots >= its execution frontier, in pages it owns (a cached
    point's shared full pages are never written, whatever frontier it is adopted at). The slot
    gather runs the XLA path on every backend: one MTP layer, the main layers keep the kernel."""
    if rope is None:
        q, k, v, gate = layer.attention_project(h, positions)
    else:  # M-RoPE triples (a request with media)
        q, k, v, gate = layer.attention_project(h, rope, triples=True)
    k_pages, v_pages = paged_attention.write_kv(k_pages, v_pages, k, v, page_table, start_pos + SLOT_SHIFT,
                                                lengths, backend=backend)
    o = paged_attention.prefill_attention_reference(q, k_pages, v_pages, page_table, start_pos, lengths,
                                                    scale=cfg.head_dim ** -0.5, key_offset=SLOT_SHIFT)
    return layer.attention_output(o, gate), k_pages, v_pages


def mtp_prefill(params, pool, final, next_tokens, start_pos, lengths, page_table, *, cfg: ModelConfig,
                merger, backend: str = "xla", all_logits: bool = False):
    """final `[R, T, H]` the main final-normed hiddens at indices start_pos..start_pos+T-1,
    next_tokens `[R, T]` the tokens one further, start_pos/lengths `[R]` (length 0: padding row),
    page_table `[R, P]` into the MTP pool; `params` the leaves of `split(HybridLM(cfg, params,
    mtp))` with its `merger`.

    Returns (logits `[R, V]` at each row's last valid index — or `[R, T, V]` with all_logits —,
    the MTP output hidden there `[R, H]`, pool)."""
    check_mtp_prefill_args(pool, final, next_tokens, start_pos, lengths, page_table, cfg)
    lm = merger(params)
    out, pool = mtp_chunk(lm, pool, final, next_tokens, start_pos, lengths, page_table, cfg, backend)
    last = out[jnp.arange(out.shape[0]), jnp.maximum(lengths - 1, 0)]
    return lm.logits(out if all_logits else last), last, pool


def mtp_draft(params, pool, final, tokens, positions, page_table, *, k: int, cfg: ModelConfig, merger,
              backend: str = "xla"):
    """k greedy drafts per row. final `[B, H]` the continuation hidden at frontier−1, tokens `[B]`
    the last committed token (ledger[frontier]), positions `[B]` = frontier−1 (negative: padding
    row, writes nothing), page_table `[B, P]` into the MTP pool, valid on [0, frontier−1) and
    covering positions up to frontier+k−2 (the drafts' K/V).

    Returns (drafts `[B, k]` int32, their logits `[B, k, V]` float32 — the draft distributions
    speculative sampling needs —, pool)."""
    check_mtp_draft_args(pool, final, tokens, positions, page_table, cfg)
    if not 1 <= k <= MAX_DRAFT:
        raise StepArgumentError(f"argument 'k' of mtp_draft: expected 1..{MAX_DRAFT}, got {k}")
    lm = merger(params)
    active = positions >= 0
    lengths = active.astype(jnp.int32)
    start = jnp.where(active, positions, 0)
    hidden, token = final, tokens
    drafts, logits = [], []
    for i in range(k):  # CKP-3: step 0 is the frontier−1 bridge, later steps recurse on MTP hiddens
        out, pool = mtp_chunk(lm, pool, hidden[:, None], token[:, None], start + i, lengths, page_table,
                               cfg, backend)
        hidden = out[:, 0]
        step_logits = lm.logits(hidden)
        token = jnp.argmax(step_logits, axis=-1).astype(jnp.int32)
        drafts.append(token)
        logits.append(step_logits)
    return jnp.stack(drafts, axis=1), jnp.stack(logits, axis=1), pool


class MTPSteps:
    """The jitted MTP steps of one model (main params + the internal MTP pytree), the pool
    donated. The module is split once over the same device arrays (no copies)."""

    def __init__(self, cfg: ModelConfig, params: dict, mtp: dict, backend: str = "xla"):
        from ninfer_jax.model.modules import HybridLM, split  # flax: imported with the first model

        if mtp is None or not cfg.mtp_num_hidden_layers:
            raise ValueError("this model has no MTP head (config mtp_num_hidden_layers is 0 or no mtp tensors)")
        self.config = cfg
        dtype = jax.tree.leaves(params)[0].dtype
        mtp = jax.tree.map(lambda a: jnp.asarray(np.asarray(a), dtype), mtp)
        self.merger, self.leaves = split(HybridLM(cfg, params, mtp))
        common = dict(cfg=cfg, merger=self.merger, backend=backend)
        self._prefill = jax.jit(functools.partial(mtp_prefill, **common), static_argnames=("all_logits",),
                                donate_argnums=(1,))
        self._draft = jax.jit(functools.partial(mtp_draft, **common), static_argnames=("k",), donate_argnums=(1,))

    @classmethod
    def for_model(cls, model, backend: str = "xla") -> MTPSteps:
        """From a loaded `Model` (its `mtp.*` tensors kept by name)."""
        from ninfer_jax.model.weights import mtp_params

        if model.mtp is None:
            raise ValueError(f"{model.name} has no MTP head")
        return cls(model.config, model.params, mtp_params(model.mtp, model.config), backend)

    def prefill(self, pool, final, next_tokens, start_pos, lengths, page_table, *, all_logits=False):
        return self._prefill(self.leaves, pool, final, next_tokens, start_pos, lengths, page_table,
                             all_logits=all_logits)

    def draft(self, pool, final, tokens, positions, page_table, *, k: int):
        return self._draft(self.leaves, pool, final, tokens, positions, page_table, k=k)
