"""Step functions over paged Main KV and StateImage slots.

Pools (pytrees of device arrays, donated to every step):
  kv    = {"k": (per attention layer) [num_pages, PAGE_SIZE, Hkv, D],  "v": same}
  state = {"conv":      (per GDN layer) [slots, K-1, conv_dim]       model dtype
           "recurrent": (per GDN layer) [slots, Hv, Dk, Dv]          float32
           "hidden":    [slots, hidden]   the continuation hidden (final-norm output of the
                                          last computed token, so a hit can sample at once)}
A StateImage is one slot index across all of these (all-or-nothing, G-2).

`prefill_chunk` runs a ragged chunk: R rows, each continuing its own request from its own
frontier `start_pos` with `lengths[r]` valid tokens (0 = padding row). `decode_step` runs one
token for each of B rows. Rows address their KV through `page_table` and their state through
`slots`; a negative slot (padding) reads zeros and writes nothing. A row whose `start_pos` is 0
starts from the zero state whatever its slot holds.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import time

import jax
import jax.numpy as jnp

from ninfer_jax.model import layers as L
from ninfer_jax.model.config import LINEAR, ModelConfig
from ninfer_jax.model.model import Model, lm_head
from pallas_kernels import conv1d, gdn, page_copy, paged_attention

PAGE_SIZE = 64  # Main KV tokens per page
GDN_CHUNK = 64

log = logging.getLogger("ninfer_jax.model")


def init_pools(cfg: ModelConfig, num_pages: int, num_slots: int, dtype) -> tuple[dict, dict]:
    """Zeroed Main KV pages and StateImage slots for `cfg`."""
    kv_shape = (num_pages, PAGE_SIZE, cfg.num_key_value_heads, cfg.head_dim)
    n_attn, n_lin = len(cfg.attention_layers), len(cfg.linear_layers)
    kv = {"k": tuple(jnp.zeros(kv_shape, dtype) for _ in range(n_attn)),
          "v": tuple(jnp.zeros(kv_shape, dtype) for _ in range(n_attn))}
    conv_shape = (num_slots, cfg.linear_conv_kernel_dim - 1, cfg.conv_dim)
    rec_shape = (num_slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    state = {"conv": tuple(jnp.zeros(conv_shape, dtype) for _ in range(n_lin)),
             "recurrent": tuple(jnp.zeros(rec_shape, jnp.float32) for _ in range(n_lin)),
             "hidden": jnp.zeros((num_slots, cfg.hidden_size), dtype)}
    return kv, state


def _read_state(state: dict, j: int, slots, fresh, backend: str):
    """Layer j's conv and recurrent state for each row; fresh rows start from zeros."""
    conv = page_copy.gather(state["conv"][j], slots, backend=backend)
    rec = page_copy.gather(state["recurrent"][j], slots, backend=backend)
    conv = jnp.where(fresh[:, None, None], jnp.zeros_like(conv), conv)
    rec = jnp.where(fresh[:, None, None, None], jnp.zeros_like(rec), rec)
    return conv, rec


def _write_state(state: dict, j: int, slots, conv, rec, backend: str) -> dict:
    new_conv = list(state["conv"])
    new_rec = list(state["recurrent"])
    new_conv[j] = page_copy.scatter(state["conv"][j], slots, conv, backend=backend)
    new_rec[j] = page_copy.scatter(state["recurrent"][j], slots, rec, backend=backend)
    return dict(state, conv=tuple(new_conv), recurrent=tuple(new_rec))


def _set_layer(kv: dict, a: int, k_pages, v_pages) -> dict:
    k, v = list(kv["k"]), list(kv["v"])
    k[a], v[a] = k_pages, v_pages
    return {"k": tuple(k), "v": tuple(v)}


def prefill_chunk(params, kv, state, tokens, start_pos, lengths, page_table, slots, *,
                  cfg: ModelConfig, backend: str = "xla", all_logits: bool = False):
    """tokens `[R, T]`, start_pos/lengths/slots `[R]`, page_table `[R, P]`.

    Returns (logits, hidden, kv, state): logits `[R, V]` at each row's last valid token (or
    `[R, T, V]` with all_logits), hidden `[R, H]` the continuation hidden of that token.
    """
    r, t = tokens.shape
    valid = jnp.arange(t)[None, :] < lengths[:, None]  # [R, T]
    writes = jnp.where(lengths > 0, slots, -1)
    fresh = start_pos == 0
    positions = start_pos[:, None] + jnp.arange(t)[None, :]
    x = params["embed"][tokens]
    lin = attn = 0
    for i, p in enumerate(params["layers"]):
        h = L.rms_norm(x, p["input_norm"], cfg.rms_norm_eps)
        if cfg.layer_types[i] == LINEAR:
            conv_state, rec_state = _read_state(state, lin, slots, fresh, backend)
            mixed, z, b, a = L.gdn_project(p, h, cfg)
            mixed, conv_state = conv1d.causal_conv1d_prefill(mixed, conv_state, p["conv"], lengths, backend=backend)
            q, k, v, g, beta = L.gdn_gates(p, mixed, b, a, cfg)
            # Padding tokens must leave the recurrent state untouched: decay 1, no update.
            g = jnp.where(valid[..., None], g, 0.0)
            beta = jnp.where(valid[..., None], beta, 0.0)
            k = jnp.where(valid[..., None, None], k, 0.0)
            o, rec_state = gdn.chunk_gated_delta_rule(q, k, v, g, beta, rec_state, chunk_size=GDN_CHUNK,
                                                      backend=backend)
            h = L.gdn_output(p, o, z, cfg)
            state = _write_state(state, lin, writes, conv_state, rec_state, backend)
            lin += 1
        else:
            q, k, v, gate = L.attention_project(p, h, positions, cfg)
            k_pages, v_pages = paged_attention.write_kv(kv["k"][attn], kv["v"][attn], k, v, page_table,
                                                        start_pos, lengths, backend=backend)
            o = paged_attention.prefill_attention(q, k_pages, v_pages, page_table, start_pos, lengths,
                                                  scale=cfg.head_dim ** -0.5, backend=backend)
            h = L.attention_output(p, o, gate)
            kv = _set_layer(kv, attn, k_pages, v_pages)
            attn += 1
        x = x + h
        x = x + L.feed_forward(p, L.rms_norm(x, p["post_norm"], cfg.rms_norm_eps), cfg.mlp_types[i], cfg)
    final = L.rms_norm(x, params["norm"], cfg.rms_norm_eps)  # [R, T, H]
    last = final[jnp.arange(r), jnp.maximum(lengths - 1, 0)]
    state = dict(state, hidden=page_copy.scatter(state["hidden"], writes, last, backend=backend))
    logits = lm_head(params, final if all_logits else last)
    return logits, last, kv, state


def decode_step(params, kv, state, tokens, positions, page_table, slots, *,
                cfg: ModelConfig, backend: str = "xla"):
    """tokens/positions/slots `[B]`, page_table `[B, P]`; a row with a negative slot is padding.

    Returns (logits `[B, V]`, hidden `[B, H]`, kv, state).
    """
    active = slots >= 0
    fresh = positions == 0
    x = params["embed"][tokens]
    lin = attn = 0
    for i, p in enumerate(params["layers"]):
        h = L.rms_norm(x, p["input_norm"], cfg.rms_norm_eps)
        if cfg.layer_types[i] == LINEAR:
            conv_state, rec_state = _read_state(state, lin, slots, fresh, backend)
            mixed, z, b, a = L.gdn_project(p, h, cfg)
            mixed, conv_state = conv1d.causal_conv1d_update(mixed, conv_state, p["conv"], backend=backend)
            q, k, v, g, beta = L.gdn_gates(p, mixed, b, a, cfg)
            o, rec_state = gdn.recurrent_gated_delta_rule_step(q, k, v, g, beta, rec_state, backend=backend)
            h = L.gdn_output(p, o, z, cfg)
            state = _write_state(state, lin, slots, conv_state, rec_state, backend)
            lin += 1
        else:
            q, k, v, gate = L.attention_project(p, h, positions, cfg)
            k_pages, v_pages = paged_attention.write_kv(
                kv["k"][attn], kv["v"][attn], k[:, None], v[:, None], page_table, positions,
                active.astype(jnp.int32), backend=backend)
            o = paged_attention.decode_attention(q, k_pages, v_pages, page_table,
                                                 jnp.where(active, positions + 1, 0),
                                                 scale=cfg.head_dim ** -0.5, backend=backend)
            h = L.attention_output(p, o, gate)
            kv = _set_layer(kv, attn, k_pages, v_pages)
            attn += 1
        x = x + h
        x = x + L.feed_forward(p, L.rms_norm(x, p["post_norm"], cfg.rms_norm_eps), cfg.mlp_types[i], cfg)
    final = L.rms_norm(x, params["norm"], cfg.rms_norm_eps)
    state = dict(state, hidden=page_copy.scatter(state["hidden"], slots, final, backend=backend))
    return lm_head(params, final), final, kv, state


@dataclasses.dataclass
class Compilation:
    bucket: tuple
    seconds: float


class CompiledSteps:
    """The jitted steps of one model, compiled once per shape bucket with the pools donated.

    Every compilation is recorded (`compilations`) and announced on stderr, so callers can
    warm up every bucket and then assert that nothing compiles again.
    """

    def __init__(self, model: Model, backend: str = "xla", progress: bool = True):
        self.model = model
        self.backend = backend
        self.progress = progress
        self.compilations: list[Compilation] = []
        self._executables: dict[tuple, object] = {}
        self._pools: tuple | None = None  # shapes and dtypes of the pools the executables take
        cfg = model.config
        self._prefill = jax.jit(functools.partial(prefill_chunk, cfg=cfg, backend=backend),
                                static_argnames=("all_logits",), donate_argnums=(1, 2))
        self._decode = jax.jit(functools.partial(decode_step, cfg=cfg, backend=backend), donate_argnums=(1, 2))

    def bind_pools(self, kv, state) -> None:
        """Declare the pools these steps will run on. Buckets are keyed by the per-call shapes
        only, so every Program sharing these steps must have pools of the same shapes."""
        shapes = tuple((a.shape, jnp.dtype(a.dtype).name) for a in jax.tree.leaves((kv, state)))
        if self._pools is None:
            self._pools = shapes
        elif self._pools != shapes:
            raise ValueError("these compiled steps run on pools of other shapes (another capacity or "
                             "dtype): build new CompiledSteps for this Program")

    def _executable(self, kind: str, fn, args: tuple, static: dict):
        bucket = (kind,) + tuple(a.shape for a in args[3:]) + tuple(sorted(static.items()))
        exe = self._executables.get(bucket)
        if exe is None:
            start = time.perf_counter()
            exe = fn.lower(*args, **static).compile()
            seconds = time.perf_counter() - start
            self.compilations.append(Compilation(bucket, seconds))
            self._executables[bucket] = exe
            if self.progress:
                print(f"[ninfer] compiled {kind} bucket {bucket[1:]} in {seconds:.1f}s", file=sys.stderr)
        return exe

    def prefill(self, kv, state, tokens, start_pos, lengths, page_table, slots, *, all_logits=False):
        args = (self.model.params, kv, state, tokens, start_pos, lengths, page_table, slots)
        return self._executable("prefill", self._prefill, args, {"all_logits": all_logits})(*args)

    def decode(self, kv, state, tokens, positions, page_table, slots):
        args = (self.model.params, kv, state, tokens, positions, page_table, slots)
        return self._executable("decode", self._decode, args, {})(*args)
