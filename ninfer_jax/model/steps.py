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

The steps run the model's nnx modules (`modules.HybridLM`, merged inside the jitted function
from the split made once at load): embedding, per-layer projections, outputs, feed-forward,
final norm and head are the modules' methods; only the paged token-mixer cores (conv with a
rolling state, chunked delta rule, paged attention) are the step's own. Arguments are checked
statically against the config (`check_prefill_args`, `check_decode_args`): a misshapen one
raises `StepArgumentError` naming it, at trace time.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import time
from typing import TYPE_CHECKING

import chex
import jax
import jax.numpy as jnp

from ninfer_jax.compile_cache import compile_counted
from ninfer_jax.model.config import LINEAR, ModelConfig
from ninfer_jax.model.model import Model
from pallas_kernels import conv1d, gdn, page_copy, paged_attention

if TYPE_CHECKING:  # flax is imported only when a model is first used
    from ninfer_jax.model.modules import HybridLM, Merger

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


def _set_layer(kv: dict, a: int, k_pages, v_pages) -> dict:
    k, v = list(kv["k"]), list(kv["v"])
    k[a], v[a] = k_pages, v_pages
    return dict(kv, k=tuple(k), v=tuple(v))


class StepArgumentError(ValueError):
    """A step argument of the wrong shape or dtype, named. The checks read only static shapes
    and dtypes, so inside jit they run once per trace (a compiled step pays nothing)."""


def _arg(where: str, name: str, x, shape=None, kind=None, rank=None) -> None:
    """chex static checks of one argument, failing with a StepArgumentError that names it."""
    what = f"argument {name!r} of {where}"
    if rank is not None:
        chex.assert_rank(x, rank, custom_message=f"{what}: expected rank {rank}", exception_type=StepArgumentError)
    if shape is not None:
        shown = "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"
        chex.assert_shape(x, shape, custom_message=f"{what}: expected shape {shown}", exception_type=StepArgumentError)
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
        _arg(where, f"kv['k'][{a}]", kv["k"][a], kv_shape, float)
        _arg(where, f"kv['v'][{a}]", kv["v"][a], tuple(kv["k"][a].shape), float)
    if "hidden" not in state:
        raise StepArgumentError(f"pool 'hidden' of {where}: missing")
    slots = state["hidden"].shape[0] if len(state["hidden"].shape) else None
    _arg(where, "state['hidden']", state["hidden"], (slots, cfg.hidden_size), float)
    conv = (slots, cfg.linear_conv_kernel_dim - 1, cfg.conv_dim)
    rec = (slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    for j in range(n_lin):
        _arg(where, f"state['conv'][{j}]", state["conv"][j], conv, float)
        _arg(where, f"state['recurrent'][{j}]", state["recurrent"][j], rec, jnp.float32)


def check_prefill_args(kv, state, tokens, start_pos, lengths, page_table, slots, cfg: ModelConfig,
                       where: str = "prefill_chunk") -> None:
    """A ragged chunk's arguments (`prefill_chunk`, and `verify_step`'s, which are the same)."""
    _arg(where, "tokens", tokens, rank=2, kind=int)
    r = tokens.shape[0]
    for name, x in (("start_pos", start_pos), ("lengths", lengths), ("slots", slots)):
        _arg(where, name, x, (r,), int)
    _arg(where, "page_table", page_table, (r, None), int)
    check_pools(kv, state, cfg, where)


def check_decode_args(kv, state, tokens, positions, page_table, slots, cfg: ModelConfig) -> None:
    where = "decode_step"
    _arg(where, "tokens", tokens, rank=1, kind=int)
    b = tokens.shape[0]
    for name, x in (("positions", positions), ("slots", slots)):
        _arg(where, name, x, (b,), int)
    _arg(where, "page_table", page_table, (b, None), int)
    check_pools(kv, state, cfg, where)


def _module(params, cfg: ModelConfig, merger: Merger | None) -> HybridLM:
    """The model inside a traced step: `merger(leaves)` (the nnx split made once at load), or,
    for a direct caller passing the params dict, a module built over it."""
    if merger is not None:
        return merger(params)
    from ninfer_jax.model.modules import HybridLM  # flax: imported when a step first traces

    return HybridLM(cfg, params)


def paged_attention_chunk(layer, h, positions, k_pages, v_pages, page_table, start_pos, lengths,
                          cfg: ModelConfig, backend: str):
    """One gated-attention mixer over a ragged chunk: h `[R, T, H]` (normed), positions `[R, T]`.
    Writes the chunk's K/V into the row's pages, then attends causally over them. Returns (out
    `[R, T, H]`, k_pages, v_pages)."""
    q, k, v, gate = layer.attention_project(h, positions)
    k_pages, v_pages = paged_attention.write_kv(k_pages, v_pages, k, v, page_table, start_pos, lengths,
                                                backend=backend)
    o = paged_attention.prefill_attention(q, k_pages, v_pages, page_table, start_pos, lengths,
                                          scale=cfg.head_dim ** -0.5, backend=backend)
    return layer.attention_output(o, gate), k_pages, v_pages


def main_attention_chunk(layer, h, positions, kv, attn: int, page_table, start_pos, lengths,
                         cfg: ModelConfig, backend: str):
    """`paged_attention_chunk` on Main KV's attention layer `attn`: returns (out, kv)."""
    h, k_pages, v_pages = paged_attention_chunk(layer, h, positions, kv["k"][attn], kv["v"][attn],
                                                page_table, start_pos, lengths, cfg, backend)
    return h, _set_layer(kv, attn, k_pages, v_pages)


def prefill_chunk(params, kv, state, tokens, start_pos, lengths, page_table, slots, *,
                  cfg: ModelConfig, backend: str = "xla", all_logits: bool = False,
                  merger: Merger | None = None, with_final: bool = False, write_hidden: bool = True):
    """tokens `[R, T]`, start_pos/lengths/slots `[R]`, page_table `[R, P]`; `params` the
    model's split leaves with their `merger`, or the params dict (merger None).

    Returns (logits, hidden, kv, state): logits `[R, V]` at each row's last valid token (or
    `[R, T, V]` with all_logits), hidden `[R, H]` the continuation hidden of that token; with
    `with_final`, also the final-normed hidden of every position `[R, T, H]` (the MTP layers'
    input, spec_steps.py). `write_hidden=False` leaves the slots' continuation hidden to the
    caller (`write_hidden_state`).
    """
    check_prefill_args(kv, state, tokens, start_pos, lengths, page_table, slots, cfg)
    lm = _module(params, cfg, merger)
    r, t = tokens.shape
    valid = jnp.arange(t)[None, :] < lengths[:, None]  # [R, T]
    writes = jnp.where(lengths > 0, slots, -1)
    fresh = start_pos == 0
    positions = start_pos[:, None] + jnp.arange(t)[None, :]
    x = lm.embed_tokens(tokens)
    lin = attn = 0
    for layer in lm.layers:
        h = layer.mixer_norm(x)
        if layer.kind == LINEAR:
            conv_state, rec_state = _read_state(state, lin, slots, fresh, backend)
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
            state = _write_state(state, lin, writes, conv_state, rec_state, backend)
            lin += 1
        else:
            h, kv = main_attention_chunk(layer, h, positions, kv, attn, page_table, start_pos, lengths, cfg, backend)
            attn += 1
        x = layer.feed_forward(x + h)
    final = lm.final_norm(x)  # [R, T, H]
    last = final[jnp.arange(r), jnp.maximum(lengths - 1, 0)]
    if write_hidden:
        state = write_hidden_state(state, slots, lengths, last, backend=backend)
    logits = lm.logits(final if all_logits else last)
    if with_final:
        return logits, last, kv, state, final
    return logits, last, kv, state


def decode_step(params, kv, state, tokens, positions, page_table, slots, *,
                cfg: ModelConfig, backend: str = "xla", merger: Merger | None = None):
    """tokens/positions/slots `[B]`, page_table `[B, P]`; a row with a negative slot is padding.
    `params` as for `prefill_chunk`.

    Returns (logits `[B, V]`, hidden `[B, H]`, kv, state).
    """
    check_decode_args(kv, state, tokens, positions, page_table, slots, cfg)
    lm = _module(params, cfg, merger)
    active = slots >= 0
    fresh = positions == 0
    x = lm.embed_tokens(tokens)
    lin = attn = 0
    for layer in lm.layers:
        h = layer.mixer_norm(x)
        if layer.kind == LINEAR:
            conv_state, rec_state = _read_state(state, lin, slots, fresh, backend)
            mixed, z, b, a = layer.gdn_project(h)
            mixed, conv_state = conv1d.causal_conv1d_update(mixed, conv_state, layer.conv[...], backend=backend)
            q, k, v, g, beta = layer.gdn_gates(mixed, b, a)
            o, rec_state = gdn.recurrent_gated_delta_rule_step(q, k, v, g, beta, rec_state, backend=backend)
            h = layer.gdn_output(o, z)
            state = _write_state(state, lin, slots, conv_state, rec_state, backend)
            lin += 1
        else:
            q, k, v, gate = layer.attention_project(h, positions)
            k_pages, v_pages = paged_attention.write_kv(
                kv["k"][attn], kv["v"][attn], k[:, None], v[:, None], page_table, positions,
                active.astype(jnp.int32), backend=backend)
            o = paged_attention.decode_attention(q, k_pages, v_pages, page_table,
                                                 jnp.where(active, positions + 1, 0),
                                                 scale=cfg.head_dim ** -0.5, backend=backend)
            h = layer.attention_output(o, gate)
            kv = _set_layer(kv, attn, k_pages, v_pages)
            attn += 1
        x = layer.feed_forward(x + h)
    final = lm.final_norm(x)
    state = dict(state, hidden=page_copy.scatter(state["hidden"], slots, final, backend=backend))
    return lm.logits(final), final, kv, state


# The pools each step donates (argument positions after the params' leaves at 0): what the
# engine's CompiledSteps and `ninfer lower` both jit, from this one table.
_DONATED = {"prefill": (1, 2), "decode": (1, 2), "prefill_spec": (1, 2, 3), "spec_decode": (1, 3),
            "spec_commit": (1, 2)}


def jit_step(kind: str, cfg: ModelConfig, backend: str, merger, k: int | None = None):
    """The jitted step `kind` (prefill, decode, prefill_spec, spec_decode with `k` drafts,
    spec_commit) of a model split into `merger` and leaves, its pools donated (_DONATED)."""
    from ninfer_jax.model import spec_steps

    fn = {"prefill": prefill_chunk, "decode": decode_step, "prefill_spec": spec_steps.prefill_spec,
          "spec_decode": functools.partial(spec_steps.spec_decode, k=k), "spec_commit": spec_steps.spec_commit}[kind]
    static = ("all_logits",) if kind == "prefill" else ()
    return jax.jit(functools.partial(fn, cfg=cfg, backend=backend, merger=merger), static_argnames=static,
                   donate_argnums=_DONATED[kind])


def _pool_signature(kv, state) -> tuple:
    return tuple((tuple(a.shape), jnp.dtype(a.dtype).name) for a in jax.tree.leaves((kv, state)))


@dataclasses.dataclass
class Compilation:
    bucket: tuple
    seconds: float
    from_cache: bool = False  # read back from JAX's persistent compilation cache, not compiled


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
        self._compiled_pools: tuple | None = None  # those of the first compilation (for error messages)
        merger, _ = model.functional
        self._prefill = jit_step("prefill", model.config, backend, merger)
        self._decode = jit_step("decode", model.config, backend, merger)

    def bind_pools(self, kv, state) -> None:
        """Declare the pools these steps will run on. Buckets are keyed by the per-call shapes
        only, so every Program sharing these steps must have pools of the same shapes."""
        shapes = _pool_signature(kv, state)
        if self._pools is None:
            self._pools = shapes
        elif self._pools != shapes:
            raise ValueError("these compiled steps run on pools of other shapes (another capacity or "
                             "dtype): build new CompiledSteps for this Program")

    def _executable(self, kind: str, fn, args: tuple, static: dict):
        bucket = (kind,) + tuple(a.shape for a in jax.tree.leaves(args[3:])) + tuple(sorted(static.items()))
        exe = self._executables.get(bucket)
        if exe is None:
            start = time.perf_counter()
            exe, from_cache = compile_counted(fn.lower(*args, **static))
            seconds = time.perf_counter() - start
            if self._compiled_pools is None:
                self._compiled_pools = _pool_signature(args[1], args[2])
            self.compilations.append(Compilation(bucket, seconds, from_cache))
            self._executables[bucket] = exe
            if self.progress:  # the per-call array shapes; pools and per-position states are not shown
                shown = tuple(a.shape for a in args[3:] if hasattr(a, "shape")) + tuple(sorted(static.items()))
                how = "read from the compilation cache" if from_cache else "compiled"
                print(f"[ninfer] {how}: {kind} bucket {shown} in {seconds:.1f}s", file=sys.stderr)
        return exe

    def _run(self, kind: str, fn, args: tuple, static: dict, check):
        exe = self._executable(kind, fn, args, static)  # a new bucket traces: the checks run there
        try:
            return exe(*args)
        except (TypeError, ValueError):
            # A cached executable called with other dtypes or pools: name the argument.
            check(*args[1:], self.model.config)
            if self._compiled_pools not in (None, _pool_signature(args[1], args[2])):
                raise StepArgumentError(f"{kind}: pools of other shapes or dtypes than these steps were compiled "
                                        "for (another capacity?): build new CompiledSteps for them") from None
            raise

    def prefill(self, kv, state, tokens, start_pos, lengths, page_table, slots, *, all_logits=False):
        args = (self.model.functional[1], kv, state, tokens, start_pos, lengths, page_table, slots)
        return self._run("prefill", self._prefill, args, {"all_logits": all_logits}, check_prefill_args)

    def decode(self, kv, state, tokens, positions, page_table, slots):
        args = (self.model.functional[1], kv, state, tokens, positions, page_table, slots)
        return self._run("decode", self._decode, args, {}, check_decode_args)

    # ---- speculative decoding (spec_steps.py) ----------------------------------------------
    def enable_speculative(self, k: int) -> None:
        """Build the MTP steps for `k` drafts per row (spec_steps.py): the model with its MTP head
        split once over the same device arrays (mtp_steps.MTPSteps), the pools donated as above
        (the MTP pool too; the state only where it is written)."""
        from ninfer_jax.model.mtp_steps import MTPSteps

        mtp = MTPSteps.for_model(self.model, self.backend)
        self.speculative_tokens = k
        self._spec_leaves = mtp.leaves
        cfg, backend = self.model.config, self.backend
        self._spec_prefill = jit_step("prefill_spec", cfg, backend, mtp.merger)
        self._spec_decode = jit_step("spec_decode", cfg, backend, mtp.merger, k)
        self._spec_commit = jit_step("spec_commit", cfg, backend, mtp.merger)

    def prefill_spec(self, kv, state, mtp, tokens, start_pos, lengths, page_table, mtp_table, slots):
        args = (self._spec_leaves, kv, state, mtp, tokens, start_pos, lengths, page_table, mtp_table, slots)
        return self._run("prefill_spec", self._spec_prefill, args, {},
                         lambda kv, state, mtp, tokens, start, lengths, table, mtp_table, slots, cfg:
                         check_prefill_args(kv, state, tokens, start, lengths, table, slots, cfg))

    def spec_decode(self, kv, state, mtp, tokens, positions, page_table, mtp_table, slots, wanted):
        args = (self._spec_leaves, kv, state, mtp, tokens, positions, page_table, mtp_table, slots, wanted)
        return self._run("spec_decode", self._spec_decode, args, {},
                         lambda kv, state, mtp, tokens, positions, table, mtp_table, slots, wanted, cfg:
                         check_decode_args(kv, state, tokens, positions, table, slots, cfg))

    def spec_commit(self, state, mtp, verified, final, drafts, positions, keep, mtp_table, slots):
        args = (self._spec_leaves, state, mtp, verified, final, drafts, positions, keep, mtp_table, slots)
        return self._run("spec_commit", self._spec_commit, args, {}, lambda *a: None)
