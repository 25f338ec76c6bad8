"""The pools the steps update in place, and the static checks of every step's arguments.

Pools (pytrees of device arrays, donated to every step):
  kv    = {"k": (per attention layer) [num_pages, PAGE_SIZE, Hkv, D],  "v": same}
  state = {"conv":      (per GDN layer) [slots, K-1, conv_dim]       model dtype
           "recurrent": (per GDN layer) [slots, Hv, Dk, Dv]          float32
           "hidden":    [slots, hidden]   the continuation hidden (final-norm output of the
                                          last computed token, so a hit can sample at once)}
A StateImage is one slot index across all of these (all-or-nothing, G-2). On the "xla" path a
bfloat16 pool is stored packed (uint16 bits, pallas_kernels._common.PACKED): its rows are read
and written through page_copy / paged_attention, which unpack and pack them.

The checks (`check_prefill_args`, `check_decode_args`, `check_prefill_media`, `check_pools`) read
only static shapes and dtypes: a misshapen argument raises `StepArgumentError` naming it, once per trace.
"""
from __future__ import annotations

import chex
import jax.numpy as jnp

from ninfer_jax.model.config import ModelConfig
from pallas_kernels import page_copy
from pallas_kernels._common import PACKED, storage_dtype

PAGE_SIZE = 64  # Main KV tokens per page


def init_pools(cfg: ModelConfig, num_pages: int, num_slots: int, dtype, backend: str = "xla") -> tuple[dict, dict]:
    """Zeroed Main KV pages and StateImage slots for `cfg`, stored as `backend` keeps `dtype`
    (bfloat16 packed on "xla": pallas_kernels._common.storage_dtype)."""
    dtype = storage_dtype(dtype, backend)
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


def read_state(state: dict, j: int, slots, fresh, backend: str, after=None):
    """Layer j's conv and recurrent state for each row; fresh rows start from zeros.

    `after`: the layer's input. The read is made to wait for it (`ordered_after`), so a step
    holds one layer's gathered state at a time, not every layer's at once."""
    if after is not None:
        slots = ordered_after(slots, after)
    conv = page_copy.gather(state["conv"][j], slots, backend=backend)
    rec = page_copy.gather(state["recurrent"][j], slots, backend=backend)
    conv = jnp.where(fresh[:, None, None], jnp.zeros_like(conv), conv)
    rec = jnp.where(fresh[:, None, None, None], jnp.zeros_like(rec), rec)
    return conv, rec


def ordered_after(idx, x):
    """`idx` unchanged, computed from `x`, so whatever reads through it runs after `x` exists.

    Without it a step's state reads depend on nothing but the pool, and XLA's scheduler hoists
    every layer's read to the start of the step: a decode step held all its GDN layers' float32
    states at once (issue 33: scratch as large as the state pool, growing with layers and rows;
    an optimization barrier does not survive XLA's CPU pipeline). `t` is 1 only for a NaN in
    `x`, and min(idx, idx + t) is idx for t in {0, 1}: the value never changes, NaN or not,
    and XLA cannot fold the dependence away."""
    t = jnp.isnan(x.reshape(-1)[0]).astype(idx.dtype)
    return jnp.minimum(idx, idx + t)


def write_state(state: dict, j: int, slots, conv, rec, backend: str) -> dict:
    new_conv = list(state["conv"])
    new_rec = list(state["recurrent"])
    new_conv[j] = page_copy.scatter(state["conv"][j], slots, conv, backend=backend)
    new_rec[j] = page_copy.scatter(state["recurrent"][j], slots, rec, backend=backend)
    return dict(state, conv=tuple(new_conv), recurrent=tuple(new_rec))


def write_hidden_state(state: dict, slots, lengths, last, *, backend: str, read=None) -> dict:
    """The continuation hidden `last` `[R, H]` into the slots of the rows with tokens.

    `read`: a value the caller gathered from the old hidden pool and uses elsewhere. The write
    is made to depend on it (selected only for a row of negative length, which never exists), so
    XLA orders the read before the in-place write instead of copying the whole pool to keep the
    old one alive: an optimization barrier does not survive XLA's CPU pipeline."""
    if read is not None:
        last = jnp.where((lengths < 0)[:, None], read.astype(last.dtype), last)
    writes = jnp.where(lengths > 0, slots, -1)
    return dict(state, hidden=page_copy.scatter(state["hidden"], writes, last, backend=backend))


def set_layer(kv: dict, a: int, k_pages, v_pages) -> dict:
    k, v = list(kv["k"]), list(kv["v"])
    k[a], v[a] = k_pages, v_pages
    return dict(kv, k=tuple(k), v=tuple(v))


class StepArgumentError(ValueError):
    """A step argument of the wrong shape or dtype, named. The checks read only static shapes
    and dtypes, so inside jit they run once per trace (a compiled step pays nothing)."""


POOL = "pool"  # check_arg's kind of a pool of numbers: floating, or packed bfloat16


def check_arg(where: str, name: str, x, shape=None, kind=None, rank=None) -> None:
    """chex static checks of one argument, failing with a StepArgumentError that names it."""
    what = f"argument {name!r} of {where}"
    if rank is not None:
        chex.assert_rank(x, rank, custom_message=f"{what}: expected rank {rank}", exception_type=StepArgumentError)
    if shape is not None:
        shown = "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"
        chex.assert_shape(x, shape, custom_message=f"{what}: expected shape {shown}", exception_type=StepArgumentError)
    if kind == POOL:
        kind = PACKED if x.dtype == PACKED else float
    if kind is not None:
        chex.assert_type(x, kind, custom_message=f"{what}: expected {'an integer' if kind is int else kind} dtype",
                         exception_type=StepArgumentError)


def check_pools(kv, state, cfg: ModelConfig, where: str = "the step") -> None:
    """The pools match `cfg` (`init_pools`' layout): one KV pair per attention layer, one conv
    and one float32 recurrent state per GDN layer, every slot pool of the same length."""
    n_attn, n_lin = len(cfg.attention_layers), len(cfg.linear_layers)
    for key, n, pool in (("k", n_attn, kv.get("k")), ("v", n_attn, kv.get("v")),
                         ("conv", n_lin, state.get("conv")), ("recurrent", n_lin, state.get("recurrent"))):
        if not isinstance(pool, (tuple, list)) or len(pool) != n:
            got = "nothing" if pool is None else (f"{len(pool)}" if isinstance(pool, (tuple, list))
                                                  else type(pool).__name__)
            layer = "attention" if key in ("k", "v") else "GDN"
            raise StepArgumentError(f"pool {key!r} of {where}: expected a tuple of {n} arrays (one per "
                                    f"{layer} layer), got {got}")
    kv_shape = (None, PAGE_SIZE, cfg.num_key_value_heads, cfg.head_dim)
    for a in range(n_attn):
        check_arg(where, f"kv['k'][{a}]", kv["k"][a], kv_shape, POOL)
        check_arg(where, f"kv['v'][{a}]", kv["v"][a], tuple(kv["k"][a].shape), POOL)
    if "hidden" not in state:
        raise StepArgumentError(f"pool 'hidden' of {where}: missing")
    slots = state["hidden"].shape[0] if len(state["hidden"].shape) else None
    check_arg(where, "state['hidden']", state["hidden"], (slots, cfg.hidden_size), POOL)
    conv = (slots, cfg.linear_conv_kernel_dim - 1, cfg.conv_dim)
    rec = (slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    for j in range(n_lin):
        check_arg(where, f"state['conv'][{j}]", state["conv"][j], conv, POOL)
        check_arg(where, f"state['recurrent'][{j}]", state["recurrent"][j], rec, jnp.float32)


def check_prefill_args(kv, state, tokens, start_pos, lengths, page_table, slots, cfg: ModelConfig,
                       where: str = "prefill_chunk") -> None:
    """A ragged chunk's arguments (`prefill_chunk`, and `verify_step`'s, which are the same)."""
    check_arg(where, "tokens", tokens, rank=2, kind=int)
    r = tokens.shape[0]
    for name, x in (("start_pos", start_pos), ("lengths", lengths), ("slots", slots)):
        check_arg(where, name, x, (r,), int)
    check_arg(where, "page_table", page_table, (r, None), int)
    check_pools(kv, state, cfg, where)


def check_decode_args(kv, state, tokens, positions, page_table, slots, cfg: ModelConfig) -> None:
    where = "decode_step"
    check_arg(where, "tokens", tokens, rank=1, kind=int)
    b = tokens.shape[0]
    for name, x in (("positions", positions), ("slots", slots)):
        check_arg(where, name, x, (b,), int)
    check_arg(where, "page_table", page_table, (b, None), int)
    check_pools(kv, state, cfg, where)


def check_prefill_media(tokens, embeds, embed_rows, rope, cfg: ModelConfig, where: str = "prefill_chunk") -> None:
    """A chunk's media inputs (each None for text): `embeds` `[R, T, hidden]` floating with
    `embed_rows` `[R, T]` bool (both or neither), `rope` `[3, R, T]` int on an M-RoPE model."""
    r, t = tokens.shape
    if (embeds is None) != (embed_rows is None):
        raise StepArgumentError(f"{where}: 'embeds' and 'embed_rows' go together (got only "
                                f"{'embeds' if embed_rows is None else 'embed_rows'})")
    if embeds is not None:
        check_arg(where, "embeds", embeds, (r, t, cfg.hidden_size), float)
        check_arg(where, "embed_rows", embed_rows, (r, t), bool)
    if rope is not None:
        if cfg.mrope_section is None:
            raise StepArgumentError(f"argument 'rope' of {where}: M-RoPE positions need a model with "
                                    "rope_parameters.mrope_section")
        check_arg(where, "rope", rope, (3, r, t), int)
