"""The Program: the only owner of the model's mutable resources.

It holds the parameters, the donated device pools (Main KV pages, StateImage slots) and the
Host arena through `ProgramStores`, the jitted step functions compiled once per shape bucket
at warm-up, and applies ledger plans with `commit(plan)`. The engine asks it to run one
prefill chunk and one compact decode batch per cycle.

Buckets: decode rows are padded to 2/4/8 (up to C; the capacity plan's `decode_buckets`, which also
sizes their workspace); a prefill chunk is one row padded to the shortest of the plan's
`prefill_lengths` that holds it (`chunk_size` and its quarters down to 64 tokens), its page table cut
to the narrowest of the plan's `prefill_widths` that holds the pages up to the chunk's end (the XLA
attention reads every page of its table; plan/workspace.prefill_table_widths). Padding rows carry
slot -1, so they read zeros and write nothing. The pools are the plan's (`self.plan.capacity`).
"""
from __future__ import annotations

import os
import sys
import time
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import ledger
from ninfer_jax.compile_cache import summary
from ninfer_jax.config import EngineConfig
from ninfer_jax.model.media_inputs import ChunkMedia
from ninfer_jax.model.model import Model, lm_head, load_model
from ninfer_jax.model.multimodal import encode_media
from ninfer_jax.model.vision import warm_buckets
from ninfer_jax.model.mtp_steps import init_mtp_pool
from ninfer_jax.model.spec_steps import MTP_POOL
from ninfer_jax.model.dflash import load_drafter
from ninfer_jax.model.dflash_steps import DFLASH_POOL, init_dflash_pool
from ninfer_jax.model.compiled import CompiledSteps
from ninfer_jax.model.pools import PAGE_SIZE, init_pools
from ninfer_jax.model import token_mask
from ninfer_jax.plan import Capacity, CapacityPlan, plan_capacity, with_reach
from ninfer_jax.plan.workspace import DECODE_BUCKETS, decode_buckets  # noqa: F401 (defined with the plan)
from ninfer_jax.program import calibrate
from ninfer_jax.program.stores import ProgramStores
from ninfer_jax.program.unit_pool import UnitPool

STORE_BUCKET_UNITS = 64  # a page group (HOST-3); the stores' movers are warmed for every bucket up to each pool's size


class DecodeRow(NamedTuple):
    token: int  # the token to feed (the last one sampled)
    position: int  # its logical position
    pages: Sequence[int]  # Main KV page units of the request, in logical order (read, not kept)
    slot: int  # its StateImage slot unit
    mtp_pages: Sequence[int] = ()  # its MTP pool page units (speculative decoding), in logical order
    rope: int | None = None  # its rotary position when it is not `position` (a prompt with media, M-RoPE)


def _print_shard(p) -> None:
    print(p.line(), file=sys.stderr)


class Program:
    """Real model math on the device pools."""

    # SRC-3: the source cost model, calibrated at the end of warm-up unless set before it.
    cost_model: "calibrate.CostRates | None" = None

    def __init__(self, config: EngineConfig, model: Model | None = None, steps: CompiledSteps | None = None):
        """`model`: an already loaded model (else `config.model` is loaded in
        `config.resolved_dtype`); `steps`: that model's compiled step functions, shared with
        another Program of the same pool shapes (its own pools, stores and ledger are fresh),
        so nothing compiles twice."""
        self.config = config
        if model is None and steps is not None:
            model = steps.model
        if model is None:
            progress = _print_shard if config.progress else None
            model = load_model(config.model, config.resolved_dtype, progress=progress)
        self.model = model
        self.dtype: str = model.dtype_name  # the resolved dtype ("auto" never reaches here)
        cfg = self.model.config
        itemsize = jnp.dtype(self.model.dtype).itemsize
        # CFG-2: the weights are on the device already; its bytes_in_use must not count them twice.
        resident = sum(leaf.nbytes for leaf in jax.tree.leaves(self.model.params))
        self.plan: CapacityPlan = plan_capacity(config, cfg, itemsize, resident_bytes=resident)
        self.config = config = with_reach(config, self.plan)  # CFG-6: max_context as Main KV allows
        self.capacity: Capacity = self.plan.capacity
        kv, state = init_pools(cfg, self.capacity.kv_pages, self.capacity.state_slots, self.model.dtype,
                               config.backend)
        self.speculative_tokens = config.speculative_tokens
        pools = [UnitPool(ledger.MAIN_KV, ledger.KV_PAGES, kv, PAGE_SIZE),
                 UnitPool(ledger.STATE_POOL, ledger.STATE_SLOTS, state)]
        # The drafts' backend KV pool (RES-1): the MTP layers' K/V, or a DFlash drafter's context K/V
        # (issue 35, dflash_steps.py); `spec_pool` is its ledger id.
        self.spec_pool, drafter = MTP_POOL, None
        if self.speculative_tokens and config.speculative_method == "dflash":
            drafter = load_drafter(config.draft_model, np.dtype(jnp.dtype(self.model.dtype)))
            self.spec_pool = DFLASH_POOL
        if self.speculative_tokens:
            tree = (init_dflash_pool(drafter.config, self.capacity.mtp_pages, self.model.dtype, config.backend)
                    if drafter is not None else
                    init_mtp_pool(cfg, self.capacity.mtp_pages, self.model.dtype, backend=config.backend))
            pools.append(UnitPool(self.spec_pool, ledger.KV_PAGES, tree, PAGE_SIZE))
        if steps is None:
            steps = CompiledSteps(self.model, backend=config.backend, progress=config.progress)
            if self.speculative_tokens:
                steps.enable_speculative(self.speculative_tokens, drafter)
        elif steps.model is not self.model or steps.backend != config.backend:
            raise ValueError("shared CompiledSteps must be of the same model and kernel backend")
        elif getattr(steps, "speculative_tokens", 0) != self.speculative_tokens:
            raise ValueError("shared CompiledSteps must draft as many speculative tokens as this config")
        elif getattr(steps, "drafter_config", None) != (drafter.config if drafter is not None else None):
            raise ValueError("shared CompiledSteps must draft with the same drafter as this config")
        steps.bind_pools(kv, state)
        self.stores = ProgramStores(pools, self.capacity.host_capacity_bytes)
        self.steps = steps
        self.vocab_size = cfg.vocab_size
        self.eos_token_ids = tuple(cfg.eos_token_id)
        self.chunk_size = config.chunk_size
        self.decode_buckets = self.plan.decode_buckets
        self.prefill_widths = self.plan.prefill_widths
        self.prefill_lengths = self.plan.prefill_lengths
        # State computed under another model, dtype or kernel backend is never adopted (CKP-4).
        # Points written with MTP K/V (speculative_tokens > 0) are their own execution (CKP-4).
        # A DFlash drafter's context is its own too: the drafter's folder names it.
        self.execution_tag = f"{config.model}|{self.dtype}|{config.backend}" + (
            "" if not self.speculative_tokens else f"|dflash:{drafter.folder}" if drafter is not None else "|mtp")
        self._verify = None  # the Verify unit in flight between `spec_decode` and `spec_commit`
        self._hidden_logits = jax.jit(lm_head)
        # A checkpoint with a vision tower runs every chunk and decode row (or Verify unit) through
        # the media executables (a text row with its plain positions), so a row's bits never
        # depend on whether a batch mate or a reused prefix had media (doctrine 1).
        self.takes_media = self.model.vision is not None
        self._no_media = None  # a text chunk's zero embeddings, made once
        # Wall time inside the compiled model steps, from the call to their logits on the host;
        # building their inputs is control work and is not counted (the engine's control figure).
        self.step_seconds = 0.0

    # ---- facts ----------------------------------------------------------------------
    @property
    def compilations(self) -> int:
        """Executables built: the step buckets, plus every pool's byte movers (unit_pool.py)."""
        return len(self.steps.compilations) + sum(len(p.compilations) for p in self.stores.pools.values())

    @property
    def compilations_from_cache(self) -> int:
        """Of `compilations`, those JAX's persistent compilation cache answered (nothing compiled)."""
        return (sum(c.from_cache for c in self.steps.compilations)
                + sum(c[3] for p in self.stores.pools.values() for c in p.compilations))

    @property
    def state(self) -> ledger.LedgerState:
        return self.stores.state

    def commit(self, plan) -> ledger.LedgerState:
        return self.stores.commit(plan)

    def check_integrity(self) -> ledger.Recount:
        return self.stores.check_integrity()

    @staticmethod
    def clock() -> float:
        return time.perf_counter()

    # ---- execution ------------------------------------------------------------------
    def _run(self, kind: str, *args, media=None, all_logits: bool = False):
        """One compiled step on the pools. `media`: a prefill chunk's `ChunkMedia` (one row) or
        a decode batch's rotary positions `[B]` (the media executables)."""
        kv_pool = self.stores.pools[ledger.MAIN_KV]
        st_pool = self.stores.pools[ledger.STATE_POOL]
        if kind == "prefill" and self.speculative_tokens:  # the chunk's MTP K/V too (spec_steps.py)
            tokens, start, lengths, table, slots, *mtp_table = args
            mtp_pool = self.stores.pools[self.spec_pool]
            mtp_table = mtp_table[0] if mtp_table else np.zeros_like(table)  # a padding row writes nothing
            extra = None if media is None else (media.embeds[None], media.embed_rows[None], media.rope[:, None],
                                                 media.mtp_rope[:, None])
            logits, _, kv, state, mtp = self.steps.prefill_spec(kv_pool.tree, st_pool.tree, mtp_pool.tree, tokens,
                                                                start, lengths, table, mtp_table, slots, media=extra,
                                                                all_logits=all_logits)
            mtp_pool.replace(mtp)
        elif media is not None:
            if kind == "prefill":
                logits, _, kv, state = self.steps.prefill(kv_pool.tree, st_pool.tree, *args, embeds=media.embeds[None],
                                                          embed_rows=media.embed_rows[None],
                                                          rope=media.rope[:, None], all_logits=all_logits)
            else:
                logits, _, kv, state = self.steps.decode(kv_pool.tree, st_pool.tree, *args, rope=media)
        elif kind == "prefill":
            logits, _, kv, state = self.steps.prefill(kv_pool.tree, st_pool.tree, *args, all_logits=all_logits)
        else:
            logits, _, kv, state = self.steps.decode(kv_pool.tree, st_pool.tree, *args)
        kv_pool.replace(kv)
        st_pool.replace(state)
        return logits

    def _step(self, kind: str, *args, media=None, all_logits: bool = False) -> np.ndarray:
        """One compiled step, its logits on the host; the time is counted in `step_seconds` (by
        the Program's own clock)."""
        t0 = self.clock()
        logits = np.asarray(self._run(kind, *args, media=media, all_logits=all_logits))
        self.step_seconds += self.clock() - t0
        return logits

    @property
    def serves_prompt_logprobs(self) -> bool:
        """Whether `prefill(..., all_logits=True)` is served (with speculative decoding too: its
        prefill step gives every position's logits the same way)."""
        return True

    def prefill(self, tokens: Sequence[int], start: int, pages: Sequence[int], slot: int,
                mtp_pages: Sequence[int] = (), media=None, all_logits: bool = False) -> np.ndarray:
        """One prefill chunk of one request from frontier `start`; logits `[V]` of its last token
        (`all_logits`: `[n, V]`, every token's; its own executable per table width, compiled on
        the first chunk that asks: SamplingParams.prompt_logprobs). `mtp_pages`: its MTP pool
        pages (speculative decoding); `media`: the chunk's `ChunkMedia` of width `chunk_size`
        (engine/media.py; None: text, plain positions)."""
        n = len(tokens)
        if not 0 < n <= self.chunk_size:
            raise ValueError(f"prefill chunk of {n} tokens; expected 1..{self.chunk_size}")
        if media is not None and not self.takes_media:
            raise ValueError("this Program runs text only: its model has no vision tower")
        length = self.prefill_length(n)
        buf = np.zeros((1, length), np.int32)
        buf[0, :n] = tokens
        if self.takes_media and media is None:
            media = self._text_media(start, n)
        if media is not None and length < self.chunk_size:  # a shorter chunk program: its media inputs too
            media = media.cut(length)
        # numpy in, no eager jnp conversions: the compiled step takes host arrays directly.
        width = self.prefill_width(start + n)
        extra = (self._tables([mtp_pages], 1, width),) if self.speculative_tokens else ()
        logits = self._step("prefill", buf, np.array([start], np.int32), np.array([n], np.int32),
                            self._tables([pages], 1, width), np.array([slot], np.int32), *extra, media=media,
                            all_logits=all_logits)
        return logits[0, :n] if all_logits else logits[0]

    def prefill_length(self, n: int) -> int:
        """The token length of the chunk program that runs `n` tokens: the shortest compiled one
        that holds them (plan/workspace.prefill_chunk_lengths); it depends on the chunk alone."""
        return next((t for t in self.prefill_lengths if t >= n), self.chunk_size)

    def prefill_width(self, end: int) -> int:
        """The page-table width of a chunk ending at token `end`: the narrowest compiled one that
        holds its keys (and, with MTP, the MTP layers' one slot after them). It depends on the chunk
        alone, so a chunk's bits never depend on another request."""
        need = -(-(end + (1 if self.speculative_tokens else 0)) // PAGE_SIZE)
        return next((w for w in self.prefill_widths if w >= need), self.capacity.pages_per_request)

    def _text_media(self, start: int, n: int):
        """A text chunk's media inputs: no media rows, rotary positions = cache positions."""
        if self._no_media is None:
            self._no_media = jnp.zeros((self.chunk_size, self.model.config.hidden_size), self.model.dtype)
        rope = np.zeros((3, self.chunk_size), np.int32)
        rope[:, :n] = np.arange(start, start + n, dtype=np.int32)
        mtp_rope = np.zeros((3, self.chunk_size), np.int32)  # MTP indices start-1 ..: text positions
        mtp_rope[:, :n] = np.arange(start - 1, start - 1 + n, dtype=np.int32)
        return ChunkMedia(self._no_media, np.zeros(self.chunk_size, bool), rope, mtp_rope)

    def decode(self, rows: Sequence[DecodeRow], masks=None) -> np.ndarray:
        """One decode step for each row; logits `[len(rows), V]`. `masks` (structured output):
        called once the step is dispatched, so the host work it does overlaps the step; it returns
        the rows' token bitmasks `[len(rows), token_mask.words(V)]` uint32 (a free row's all
        ones), which the compiled mask step applies to the logits before they leave the device."""
        n = len(rows)
        args = self._rows(rows)
        media = None
        if self.takes_media:  # every row's rotary position: its own, or its cache position
            media = args[1].copy()
            for i, r in enumerate(rows):
                if r.rope is not None:
                    media[i] = r.rope
        if masks is None:
            return self._step("decode", *args, media=media)[:n]
        t0 = self.clock()
        logits = self._run("decode", *args, media=media)
        bits = np.full((len(args[0]), token_mask.words(self.vocab_size)), token_mask.ALL)
        bits[:n] = masks()
        logits = np.asarray(self.steps.mask_logits(logits, bits))
        self.step_seconds += self.clock() - t0
        return logits[:n]

    def encode_media(self, pixels, grid) -> np.ndarray:
        """The vision tower's tokens `[tokens, hidden]` of one image or video, on the Host (its
        own tower call: the same bucket, hence the same bits, every time it is encoded; the
        bucket's executable is warm-up's, `tower_buckets`); counted as compute in `step_seconds`."""
        if not self.takes_media:
            raise ValueError("this Program runs text only")
        t0 = self.clock()
        out = encode_media(self.model.vision, [(pixels, grid)], executable=self.steps.tower)
        self.step_seconds += self.clock() - t0
        return out

    def tower_buckets(self) -> list[int]:
        """The vision tower's buckets (laid-out patch rows, `vision.bucket_patches`) that warm-up
        compiles: every one an image within the configured limits can take. An image's tokens are
        at most the prompt's (under `max_context`) and at most the processor's `max_pixels` /
        (patch x merge)^2 (the checkpoint's preprocessor_config.json, else the released
        defaults); each item is its own tower call, so the bucket is that of one image. A video's
        frames are segments of their own, each rounded up to `vision.segment_align` rows, so a
        video of many small frames may take a bucket above these: compiled at its first call
        (counted and announced like any compilation)."""
        if not self.takes_media:
            return []
        vcfg = self.model.vision.config
        tokens = self.config.max_context - 1  # the prompt leaves room for one generated token
        if os.path.isdir(self.config.model):
            from ninfer_jax.frontend.media import ProcessorSettings

            try:
                settings = ProcessorSettings.from_folder(self.config.model)
            except ValueError:  # the frontend names a bad processor file; the tower is not its judge
                settings = None
            if settings is not None:
                side = vcfg.patch_size * vcfg.spatial_merge_size
                tokens = min(tokens, settings.max_pixels // (side * side))
        return warm_buckets(vcfg, tokens)

    def _rows(self, rows: Sequence[DecodeRow]):
        """Padded decode-row arrays of `rows` in their bucket: tokens, positions, table, slots."""
        n = len(rows)
        bucket = next((b for b in self.decode_buckets if b >= n), None)
        if not n or bucket is None:
            raise ValueError(f"{n} decode rows; expected 1..{self.decode_buckets[-1]}")
        pad = bucket - n
        tokens = np.array([r.token for r in rows] + [0] * pad, np.int32)
        positions = np.array([r.position for r in rows] + [0] * pad, np.int32)
        slots = np.array([r.slot for r in rows] + [-1] * pad, np.int32)
        return tokens, positions, self._tables([r.pages for r in rows], bucket), slots

    def _tables(self, page_lists, bucket: int, width: int | None = None) -> np.ndarray:
        """Page tables `[bucket, width]` (default `pages_per_request`) of the rows' page lists
        (padding rows: zeros); a list's pages past `width` hold nothing the step reads."""
        width = width or self.capacity.pages_per_request
        table = np.zeros((bucket, width), np.int32)
        for i, pages in enumerate(page_lists):
            if len(pages) > width:  # only a narrowed prefill table cuts: a decode row's list is not copied
                pages = pages[:width]
            table[i, :len(pages)] = pages
        return table

    def spec_decode(self, rows: Sequence[DecodeRow], wanted: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The Verify unit of each row (spec_steps.spec_decode): `wanted[i]` drafts (0..k) after the
        row's token. Returns (logits `[n, k+1, V]` of positions n..n+k, drafts `[n, k]`); nothing
        is committed until `spec_commit`, which must follow before any other step."""
        if not self.speculative_tokens:
            raise ValueError("spec_decode needs EngineConfig(speculative_tokens > 0)")
        n = len(rows)
        tokens, positions, table, slots = self._rows(rows)
        want = np.zeros(len(slots), np.int32)
        want[:n] = wanted
        mtp_table = self._tables([r.mtp_pages for r in rows], len(slots))
        delta = None
        if self.takes_media:  # rotary minus cache position per row (0: text)
            delta = np.zeros(len(slots), np.int32)
            for i, r in enumerate(rows):
                if r.rope is not None:
                    delta[i] = r.rope - r.position
        t0 = self.clock()
        kv_pool = self.stores.pools[ledger.MAIN_KV]
        st_pool = self.stores.pools[ledger.STATE_POOL]
        mtp_pool = self.stores.pools[self.spec_pool]
        logits, drafts, final, verified, kv, mtp = self.steps.spec_decode(
            kv_pool.tree, st_pool.tree, mtp_pool.tree, tokens, positions, table, mtp_table, slots, want, delta=delta)
        kv_pool.replace(kv)
        mtp_pool.replace(mtp)
        self._verify = (verified, final, drafts, positions, mtp_table, slots, delta)
        out = np.asarray(logits)[:n], np.asarray(drafts)[:n]
        self.step_seconds += self.clock() - t0
        return out

    def spec_commit(self, keep: Sequence[int]) -> None:
        """Commit `keep[i]` accepted drafts of the Verify units `spec_decode` ran (keep <= wanted):
        state, continuation hidden and the accepted positions' MTP K/V (spec_steps.spec_commit)."""
        verified, final, drafts, positions, mtp_table, slots, delta = self._verify
        self._verify = None
        kept = np.zeros(len(slots), np.int32)
        kept[:len(keep)] = keep
        t0 = self.clock()
        st_pool = self.stores.pools[ledger.STATE_POOL]
        mtp_pool = self.stores.pools[self.spec_pool]
        state, mtp = self.steps.spec_commit(st_pool.tree, mtp_pool.tree, verified, final, drafts, positions, kept,
                                            mtp_table, slots, delta=delta)
        st_pool.replace(state)
        mtp_pool.replace(mtp)
        self.step_seconds += self.clock() - t0

    def hidden_logits(self, slot: int, last_token: int = 0, position: int = 0) -> np.ndarray:
        """Logits `[V]` from a StateImage's continuation hidden: an exact hit of a whole prompt
        samples its first token without recomputing anything (docs/rules.md, StateImage). The last
        token and its position are for the cost-model Program, which keeps no hidden."""
        hidden = self.stores.pools[ledger.STATE_POOL].read_hidden(slot)
        t0 = self.clock()
        logits = np.asarray(self._hidden_logits(self.model.params, hidden))
        self.step_seconds += self.clock() - t0
        return logits

    def warmup(self) -> None:
        """Compile every bucket once, on padding rows that write nothing."""
        towers = self.tower_buckets()
        if self.config.progress:
            print(f"[ninfer] warming up {len(self.prefill_widths) * len(self.prefill_lengths) + len(self.decode_buckets)}"
                  " step buckets" + (f" and {len(towers)} vision tower buckets" if towers else ""),
                  file=sys.stderr)
        p = self.capacity.pages_per_request
        for t in self.prefill_lengths:
            for w in self.prefill_widths:
                media = self._text_media(0, 0).cut(t) if self.takes_media else None
                self._run("prefill", jnp.zeros((1, t), jnp.int32), jnp.zeros(1, jnp.int32),
                          jnp.zeros(1, jnp.int32), jnp.zeros((1, w), jnp.int32), jnp.full(1, -1, jnp.int32),
                          media=media)
        for b in self.decode_buckets:
            if self.speculative_tokens:  # every decode row runs as a Verify unit; plain decode is not used
                self.spec_decode([DecodeRow(0, 0, (), -1)] * b, [0] * b)
                self.spec_commit([0] * b)
                continue
            logits = self._run("decode", jnp.zeros(b, jnp.int32), jnp.zeros(b, jnp.int32),
                               jnp.zeros((b, p), jnp.int32), jnp.full(b, -1, jnp.int32),
                               media=np.zeros(b, np.int32) if self.takes_media else None)
            # structured output's mask step of this bucket (`decode(..., masks=)`)
            self.steps.mask_logits(logits, np.full((b, token_mask.words(self.vocab_size)), token_mask.ALL))
        self.hidden_logits(0)
        for rows in towers:  # compiled without running: the large buckets' attention would be costly to run
            self.steps.tower(rows)
        # The stores' byte movers (captures, copy-on-write, offload and read-back) compile per
        # power-of-two index bucket too: every bucket up to each pool's size, compiled without
        # running, so no read-back or bind of any size compiles mid-run (counted in compilations).
        for pool in self.stores.pools.values():
            pool.warm_up()
        jax.block_until_ready(self.stores.pools[ledger.STATE_POOL].tree)
        if self.config.progress:
            cached = self.compilations_from_cache
            print(f"[ninfer] executables: {summary(self.compilations - cached, cached)}", file=sys.stderr)
        if self.cost_model is None:  # SRC-3: prices for source order and the pause route only
            self.cost_model = calibrate.calibrate(self)
