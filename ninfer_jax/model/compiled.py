"""The jitted steps of one model: one table of what each step donates (`jit_step`, shared
with `ninfer lower`), and `CompiledSteps`, which compiles each shape bucket once and says so.

`prefill` and `decode` with media inputs (`embeds`/`embed_rows`/`rope`, `media_inputs.py`) run
their own executables ("prefill_media", "decode_media": the step with those inputs positional);
a text call runs the text executable, exactly as without media support.

Every step (`steps.py`, and the speculative ones in `spec_steps.py` over `mtp_steps.py`)
updates its pools in place: the pools are donated, and tests/model/test_in_place.py reads each
compiled step for a whole-pool copy or convert.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import time

import jax
import jax.numpy as jnp

from ninfer_jax.compile_cache import compile_counted
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model import token_mask
from ninfer_jax.model import dflash_steps, spec_steps
from ninfer_jax.model.model import Model
from ninfer_jax.model.mtp_steps import MTPSteps
from ninfer_jax.model.pools import (
    StepArgumentError,
    check_arg,
    check_decode_args,
    check_prefill_args,
    check_prefill_media,
)
from ninfer_jax.model.steps import decode_step, prefill_chunk
from ninfer_jax.model.vision import lower_bucket


# The pools each step donates (argument positions after the params' leaves at 0): what the
# engine's CompiledSteps and `ninfer lower` both jit, from this one table.
_DONATED = {"prefill": (1, 2), "decode": (1, 2), "prefill_spec": (1, 2, 3), "spec_decode": (1, 3),
            "spec_commit": (1, 2), "prefill_media": (1, 2), "decode_media": (1, 2),
            "prefill_spec_media": (1, 2, 3), "spec_decode_media": (1, 3), "spec_commit_media": (1, 2)}


def prefill_media(params, kv, state, tokens, start_pos, lengths, page_table, slots, embeds, embed_rows, rope,
                  **kw):
    """`prefill_chunk` with its media inputs positional (a compiled executable takes no keywords)."""
    return prefill_chunk(params, kv, state, tokens, start_pos, lengths, page_table, slots, embeds=embeds,
                         embed_rows=embed_rows, rope=rope, **kw)


def decode_media(params, kv, state, tokens, positions, page_table, slots, rope, **kw):
    """`decode_step` with its rotary positions `rope` positional."""
    return decode_step(params, kv, state, tokens, positions, page_table, slots, rope=rope, **kw)


def prefill_spec_media(params, kv, state, mtp, tokens, start_pos, lengths, page_table, mtp_table, slots, embeds,
                       embed_rows, rope, mtp_rope, **kw):
    """`spec_steps.prefill_spec` with its media inputs positional."""
    return spec_steps.prefill_spec(params, kv, state, mtp, tokens, start_pos, lengths, page_table, mtp_table, slots,
                                   embeds=embeds, embed_rows=embed_rows, rope=rope, mtp_rope=mtp_rope, **kw)


def spec_decode_media(params, kv, state, mtp, tokens, positions, page_table, mtp_table, slots, wanted, delta, **kw):
    """`spec_steps.spec_decode` with the rows' rotary offsets `delta` positional."""
    return spec_steps.spec_decode(params, kv, state, mtp, tokens, positions, page_table, mtp_table, slots, wanted,
                                  delta=delta, **kw)


def spec_commit_media(params, state, mtp, verified, final, drafts, positions, keep, mtp_table, slots, delta, **kw):
    """`spec_steps.spec_commit` with the rows' rotary offsets `delta` positional."""
    return spec_steps.spec_commit(params, state, mtp, verified, final, drafts, positions, keep, mtp_table, slots,
                                  delta=delta, **kw)


def jit_step(kind: str, cfg: ModelConfig, backend: str, merger, k: int | None = None, dcfg=None):
    """The jitted step `kind` (prefill, decode, prefill_spec, spec_decode with `k` drafts,
    spec_commit, prefill_media, decode_media) of a model split into `merger` and leaves, its
    pools donated (_DONATED). `dcfg`: a DFlash drafter's config; the speculative steps are then
    dflash_steps' (their params: the target's leaves and the drafter's)."""
    if dcfg is not None and kind in _DFLASH:
        fn = functools.partial(_DFLASH[kind], k=k) if kind.startswith("spec_decode") else _DFLASH[kind]
        return jax.jit(functools.partial(fn, cfg=cfg, dcfg=dcfg, backend=backend, merger=merger),
                       static_argnames=("all_logits",) if kind.startswith("prefill_spec") else (),
                       donate_argnums=_DONATED[kind])
    fn = {"prefill": prefill_chunk, "decode": decode_step, "prefill_spec": spec_steps.prefill_spec,
          "spec_decode": functools.partial(spec_steps.spec_decode, k=k), "spec_commit": spec_steps.spec_commit,
          "prefill_media": prefill_media, "decode_media": decode_media, "prefill_spec_media": prefill_spec_media,
          "spec_decode_media": functools.partial(spec_decode_media, k=k), "spec_commit_media": spec_commit_media}[kind]
    static = ("all_logits",) if kind in ("prefill", "prefill_media", "prefill_spec", "prefill_spec_media") else ()
    return jax.jit(functools.partial(fn, cfg=cfg, backend=backend, merger=merger), static_argnames=static,
                   donate_argnums=_DONATED[kind])


_DFLASH = {"prefill_spec": dflash_steps.prefill_spec, "spec_decode": dflash_steps.spec_decode,
           "spec_commit": dflash_steps.spec_commit, "prefill_spec_media": dflash_steps.prefill_spec_media,
           "spec_decode_media": dflash_steps.spec_decode_media, "spec_commit_media": dflash_steps.spec_commit_media}


def _pool_signature(kv, state) -> tuple:
    return tuple((tuple(a.shape), jnp.dtype(a.dtype).name) for a in jax.tree.leaves((kv, state)))


@dataclasses.dataclass
class Compilation:
    bucket: tuple
    seconds: float
    from_cache: bool = False  # read back from JAX's persistent compilation cache, not compiled


_MASK = jax.jit(token_mask.mask_logits)
# The vision tower's executables by (VisionConfig, rows, params' shapes and dtypes): see `tower`.
_TOWERS: dict[tuple, object] = {}


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
        self._media: dict[str, object] = {}  # the media variants, jitted at their first call
        self.drafter_config = None  # a DFlash drafter's config once its steps are enabled

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
            # the per-call array shapes; pools and per-position states are not shown
            shown = tuple(a.shape for a in args[3:] if hasattr(a, "shape")) + tuple(sorted(static.items()))
            exe = self._compile(bucket, kind, shown, lambda: fn.lower(*args, **static))
            if self._compiled_pools is None:
                self._compiled_pools = _pool_signature(args[1], args[2])
        return exe

    def _compile(self, bucket: tuple, kind: str, shown: tuple, lower):
        """Compile `lower()` once for `bucket` (or read it from the persistent cache), recorded in
        `compilations` and announced."""
        start = time.perf_counter()
        exe, from_cache = compile_counted(lower())
        seconds = time.perf_counter() - start
        self.compilations.append(Compilation(bucket, seconds, from_cache))
        self._executables[bucket] = exe
        if self.progress:
            how = "read from the compilation cache" if from_cache else "compiled"
            print(f"[ninfer] {how}: {kind} bucket {shown} in {seconds:.1f}s", file=sys.stderr)
        return exe

    def mask_logits(self, logits, bits):
        """A decode step's logits `[B, V]` held to the rows' token bitmasks `[B, words]` uint32
        (`token_mask.mask_logits`; structured output): one small executable per bucket, run on the
        device after the step, so the mask computed on the host meanwhile is applied batched."""
        bucket = ("mask_logits", tuple(logits.shape), tuple(bits.shape))
        exe = self._executables.get(bucket)
        if exe is None:
            exe = self._compile(bucket, "mask_logits", bucket[1:], lambda: _MASK.lower(logits, bits))
        return exe(logits, bits)

    def tower(self, rows: int):
        """The vision tower's executable for a call of `rows` laid-out patch rows (a bucket of
        `vision.bucket_patches`), compiled once through the counted path (recorded in
        `compilations`, announced) or taken from `_TOWERS`: a tower executable does not depend on
        the pools, so every CompiledSteps of the same tower geometry shares it in this process
        (one compilation per bucket, not per engine)."""
        vision = self.model.vision
        if vision is None:
            raise ValueError("this model has no vision tower")
        key = (vision.config, rows, tuple((tuple(a.shape), jnp.dtype(a.dtype).name)
                                          for a in jax.tree.leaves(vision.params)))
        exe = _TOWERS.get(key)
        if exe is None:
            exe = self._compile(("vision_tower", rows), "vision_tower", ((rows, vision.config.patch_dim),),
                                lambda: lower_bucket(vision.params, vision.config, rows))
            _TOWERS[key] = exe
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

    def _media_step(self, kind: str):
        if kind not in self._media:
            self._media[kind] = jit_step(kind, self.model.config, self.backend, self.model.functional[0])
        return self._media[kind]

    def prefill(self, kv, state, tokens, start_pos, lengths, page_table, slots, *, all_logits=False,
                embeds=None, embed_rows=None, rope=None):
        """One ragged chunk (`steps.prefill_chunk`). With media, all three of `embeds` `[R, T, H]`,
        `embed_rows` `[R, T]` bool and `rope` `[3, R, T]` (a text row of the chunk: its rows
        False, its rope `start_pos + t` on each axis; `media_inputs.py`): one media executable per
        bucket, apart from the text one."""
        args = (self.model.functional[1], kv, state, tokens, start_pos, lengths, page_table, slots)
        media = (embeds, embed_rows, rope)
        if all(a is None for a in media):
            return self._run("prefill", self._prefill, args, {"all_logits": all_logits}, check_prefill_args)
        if any(a is None for a in media):
            missing = [n for n, a in zip(("embeds", "embed_rows", "rope"), media) if a is None]
            raise StepArgumentError(f"prefill with media takes embeds, embed_rows and rope together; missing {missing}")

        def check(kv, state, tokens, start, lengths, table, slots, embeds, embed_rows, rope, cfg):
            check_prefill_args(kv, state, tokens, start, lengths, table, slots, cfg)
            check_prefill_media(tokens, embeds, embed_rows, rope, cfg)

        return self._run("prefill_media", self._media_step("prefill_media"), args + media,
                         {"all_logits": all_logits}, check)

    def decode(self, kv, state, tokens, positions, page_table, slots, *, rope=None):
        """One token per row (`steps.decode_step`); `rope` `[B]`: the rows' rotary positions
        (media, its own executable per bucket), None: `positions`."""
        args = (self.model.functional[1], kv, state, tokens, positions, page_table, slots)
        if rope is None:
            return self._run("decode", self._decode, args, {}, check_decode_args)

        def check(kv, state, tokens, positions, table, slots, rope, cfg):
            check_decode_args(kv, state, tokens, positions, table, slots, cfg)
            check_arg("decode_step", "rope", rope, tuple(tokens.shape), int)

        return self._run("decode_media", self._media_step("decode_media"), args + (rope,), {}, check)

    # ---- speculative decoding (spec_steps.py) ----------------------------------------------
    def enable_speculative(self, k: int, drafter=None) -> None:
        """Build the MTP steps for `k` drafts per row (spec_steps.py): the model with its MTP head
        split once over the same device arrays (mtp_steps.MTPSteps), the pools donated as above
        (the MTP pool too; the state only where it is written). With `drafter` (a
        `dflash.Drafter`), the DFlash steps instead (dflash_steps.py), over the drafter's
        context pool; its params go to the device in the model's dtype."""
        self.drafter_config = None if drafter is None else drafter.config
        if drafter is not None:
            merger, leaves = self.model.functional
            self.speculative_tokens = k
            self._spec_leaves = (leaves, jax.tree.map(lambda a: jnp.asarray(a, self.model.dtype), drafter.params))
            self._spec_merger = merger
            self._spec = {kind: jit_step(kind, self.model.config, self.backend, merger, k, drafter.config)
                          for kind in _DFLASH}  # the media variants too: jit compiles at first call
            return
        mtp = MTPSteps.for_model(self.model, self.backend)
        self.speculative_tokens = k
        self._spec_leaves = mtp.leaves
        self._spec_merger = mtp.merger
        cfg, backend = self.model.config, self.backend
        self._spec = {kind: jit_step(kind, cfg, backend, mtp.merger, k)
                      for kind in ("prefill_spec", "spec_decode", "spec_commit")}

    def _spec_step(self, kind: str):
        """The speculative step `kind`; a media variant is jitted at its first call."""
        if kind not in self._spec:  # a DFlash drafter's are all built in enable_speculative
            self._spec[kind] = jit_step(kind, self.model.config, self.backend, self._spec_merger,
                                        self.speculative_tokens)
        return self._spec[kind]

    def prefill_spec(self, kv, state, mtp, tokens, start_pos, lengths, page_table, mtp_table, slots, *,
                     media=None, all_logits=False):
        """`media`: (embeds, embed_rows, rope, mtp_rope) of a chunk with media (issue 34), its own
        executable ("prefill_spec_media"); `all_logits` as `prefill`."""
        args = (self._spec_leaves, kv, state, mtp, tokens, start_pos, lengths, page_table, mtp_table, slots)
        kind = "prefill_spec" if media is None else "prefill_spec_media"
        return self._run(kind, self._spec_step(kind), args + tuple(media or ()), {"all_logits": all_logits},
                         lambda *a: check_prefill_args(a[0], a[1], a[3], a[4], a[5], a[6], a[8], a[-1]))

    def spec_decode(self, kv, state, mtp, tokens, positions, page_table, mtp_table, slots, wanted, *, delta=None):
        """`delta` `[B]`: the rows' rotary minus cache positions (media), its own executable."""
        args = (self._spec_leaves, kv, state, mtp, tokens, positions, page_table, mtp_table, slots, wanted)
        kind = "spec_decode" if delta is None else "spec_decode_media"
        return self._run(kind, self._spec_step(kind), args + (() if delta is None else (delta,)), {},
                         lambda *a: check_decode_args(a[0], a[1], a[3], a[4], a[5], a[7], a[-1]))

    def spec_commit(self, state, mtp, verified, final, drafts, positions, keep, mtp_table, slots, *, delta=None):
        args = (self._spec_leaves, state, mtp, verified, final, drafts, positions, keep, mtp_table, slots)
        kind = "spec_commit" if delta is None else "spec_commit_media"
        return self._run(kind, self._spec_step(kind), args + (() if delta is None else (delta,)), {},
                         lambda *a: None)
