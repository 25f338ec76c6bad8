"""The capacity plan: what a config puts on the device, and the Main KV it leaves room for (CFG-2, CFG-6).

`plan_capacity(config, model, itemsize)` is the one place the device memory budget is formed;
`resolve_capacity` (ninfer_jax/config.py) returns its pool sizes, `ninfer plan` prints it. It reads
the model's geometry only (a `ModelConfig`), never its weights.

The budget (CFG-2):

    device     D = config.device_memory_bytes            ("a device with D bytes"; nothing in use)
               or  the device's memory_stats()["bytes_limit"], less what others already hold:
                   in_use = max(0, bytes_in_use - resident_bytes)   (resident_bytes: this engine's
                   own weights when they are loaded already, so they are not charged twice)
    usable     U = floor(D × device_memory_fraction) - in_use
    charged    weights + workspace + compiled steps + StateImage slots + backend KV + Main KV ≤ U

and Main KV gets the largest page count in the CFG-6 range that fits (ledger/capacity.py). A device
that reports no statistics (the CPU backend) has no D: the pools — Main KV, StateImage slots,
backend KV — get `DEFAULT_DEVICE_BUDGET` (1 GiB), and the weights, workspace and compiled steps,
which live in host memory there, are shown but not charged (the CFG-2 default).

- **weights**: `ModelConfig.param_count()` × itemsize (what `load_model` puts on the device).
- **workspace**: the activations of the largest step, `max(prefill, decode, store moves)`:
  a prefill chunk is 1 row × `chunk_size` tokens, a decode step B rows × 1 token (B the largest
  decode bucket, the first power of two ≥ C), and for r rows of t tokens (n = r·t):

      n × A × 4                        per-token activations of one layer, as float32:
                                       A = 4·H (residual stream, norm, mixer and FF outputs)
                                         + max(GDN: conv_dim + 3·Hv·Dv + 2·Hv + 2·Hv·Dk,
                                               attention: 3·Hq·D + 2·Hkv·D)
                                         + max(dense: 2·I, MoE: E + k·(2·H + 2·I_moe) + 2·I_shared)
    + r × V × (itemsize + 4)           the logits and their float32 copy
    + r × 2 × (Hv·Dk·Dv·4 + (K-1)·conv_dim·itemsize)   one GDN layer's state read and written
    + r × 2·S·Hkv·D·4 + 3 × Hq·t·S·4 (backend xla/interpret; S = pages per request × 64):
    + [r > 1] 2·S·Hkv·D·4              the rows' whole page tables gathered as float32 K and V,
                                       and one row's scores, masked scores and probabilities
                                       (the reference attends row by row, for batch invariance;
                                       with several rows, the row's K and V sliced for the loop);
                                       the Pallas kernels read pages in place and add nothing here

  store moves: one request's whole context packed on the device for the Host (a Snapshot
  pause at `max_context`, PAUSE-2, or its read-back): pages per request × page bytes + one
  StateImage. Moves of several requests in flight together can exceed it.

  The MoE term assumes a grouped (ragged) matmul, work proportional to top-k; XLA:CPU lowers
  `ragged_dot` densely and needs far more, one more reason the CPU default charges nothing.
- **compiled steps**: an allowance, not a measurement: each model-step program (one prefill
  bucket and every decode bucket) 16 MiB + 1 MiB per layer, plus 64 MiB for the head, the
  stores' movers and the backend's own.
- **backend pools**: backend KV pools (speculative decoding); none are built yet, so 0.

One cache byte budget split (`split_cache_bytes`, `ninfer trace --cache_device_bytes=N
[--split=S]`, `ninfer plan --cache_device_bytes=N`): instead of solving against the device's
memory, N bytes are shared by the StateImage slots, the Main KV pages and the backend pools
that grow with them (weights, workspace and compiled steps are not charged: "what if the
cache had N bytes"):

    StateImage slots   k = min(floor(S × N / StateImage bytes), C + 4096)   (CFG-4: at least C)
    Main KV pages      p = the largest count with p × page bytes + backend KV(p) ≤ N − k × StateImage bytes
                                                                             (CFG-6: at least C)

The default split (`default_split`, no --split): one StateImage per quarter `max_context` of
Main KV, S = s / (s + ceil(max_context/4/64) × page bytes) for a StateImage of s bytes. A
cached context is resumed from a StateImage together with its pages; a session's contexts
grow toward `max_context` and average about half of it, and each keeps about two StateImages
(its input recovery point and its end E), so at this split the two pools run out together
(docs/trace.md, "The cache byte budget", has the measurements behind it). Then, for N known,
Main KV keeps one `max_context` (CFG-6) first: S rises to hold CFG-4's default of 2C slots
(C basic + device_state_slots = C) only as far as that allows, falls where the rule would
take those pages, and gives exactly C slots when even that leaves less than one `max_context`.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

from ledger import capacity as cap
from ninfer_jax.config import DEFAULT_DEVICE_BUDGET, Capacity, EngineConfig
from ninfer_jax.errors import ConfigError
from ninfer_jax.model.config import ModelConfig

MIB = 1 << 20
COMPILED_STEP_BASE_BYTES = 16 * MIB  # per model-step program (prefill bucket, decode bucket)
COMPILED_STEP_LAYER_BYTES = 1 * MIB  # and per model layer in it
COMPILED_OTHER_BYTES = 64 * MIB  # the head program, the stores' movers, the backend's own
SOURCES = ("device_memory_bytes", "memory_stats", "default")


def token_width(model: ModelConfig) -> int:
    """A: float32 elements per token live in one layer's step (see the module doc)."""
    h = model.hidden_size
    hv, dk, dv = model.linear_num_value_heads, model.linear_key_head_dim, model.linear_value_head_dim
    hq, hkv, d = model.num_attention_heads, model.num_key_value_heads, model.head_dim
    mixer = 0
    if model.linear_layers:
        mixer = max(mixer, model.conv_dim + 3 * hv * dv + 2 * hv + 2 * hv * dk)
    if model.attention_layers:
        mixer = max(mixer, 3 * hq * d + 2 * hkv * d)
    ff = 0
    if "dense" in model.mlp_types:
        ff = max(ff, 2 * model.intermediate_size)
    if "moe" in model.mlp_types:
        ff = max(ff, model.num_experts + model.num_experts_per_tok * (2 * h + 2 * model.moe_intermediate_size)
                 + 2 * model.shared_expert_intermediate_size)
    return 4 * h + mixer + ff


def step_workspace_bytes(model: ModelConfig, rows: int, tokens: int, pages_per_request: int, itemsize: int,
                         backend: str) -> int:
    """Device workspace of one step over `rows` rows of `tokens` tokens (the module doc's formula)."""
    n = rows * tokens
    out = n * token_width(model) * 4
    out += rows * model.vocab_size * (itemsize + 4)
    if model.linear_layers:
        hv = model.linear_num_value_heads
        per_row = hv * model.linear_key_head_dim * model.linear_value_head_dim * 4 + (
            model.linear_conv_kernel_dim - 1) * model.conv_dim * itemsize
        out += rows * 2 * per_row
    if model.attention_layers and backend in ("xla", "interpret"):
        s = pages_per_request * cap.PAGE_TOKENS
        out += rows * 2 * s * model.num_key_value_heads * model.head_dim * 4
        # the reference attends row by row (batch invariance): one row's scores at a time, and
        # with several rows, the row's keys and values sliced out for the loop's body
        out += 3 * model.num_attention_heads * tokens * s * 4
        if rows > 1:
            out += 2 * s * model.num_key_value_heads * model.head_dim * 4
    return out


@dataclasses.dataclass(frozen=True)
class Workspace:
    prefill_bytes: int  # one prefill chunk: 1 row × chunk_size tokens
    decode_bytes: int  # the largest decode bucket: decode_rows × 1 token
    decode_rows: int
    store_bytes: int  # one request's whole context packed for the Host: its pages and its StateImage
    store_pages: int

    @property
    def bytes(self) -> int:
        return max(self.prefill_bytes, self.decode_bytes, self.store_bytes)


def workspace(config: EngineConfig, model: ModelConfig, itemsize: int) -> Workspace:
    from ninfer_jax.program.program import decode_buckets

    per_request = cap.pages_for_tokens(config.max_context)
    rows = decode_buckets(config.max_concurrency)[-1]
    page_bytes = model.kv_bytes_per_token(itemsize) * cap.PAGE_TOKENS
    return Workspace(
        prefill_bytes=step_workspace_bytes(model, 1, config.chunk_size, per_request, itemsize, config.backend),
        decode_bytes=step_workspace_bytes(model, rows, 1, per_request, itemsize, config.backend),
        decode_rows=rows, store_bytes=per_request * page_bytes + model.state_image_bytes(itemsize),
        store_pages=per_request)


def compiled_step_programs(config: EngineConfig) -> int:
    """Model-step programs compiled at warm-up: one prefill bucket and every decode bucket (with
    speculative decoding two per bucket: the draft-and-verify step and the commit)."""
    from ninfer_jax.program.program import decode_buckets

    return 1 + (2 if config.speculative_tokens else 1) * len(decode_buckets(config.max_concurrency))


def compiled_program_bytes(model: ModelConfig) -> int:
    """The allowance for one model-step program: 16 MiB + 1 MiB per layer (module doc)."""
    return COMPILED_STEP_BASE_BYTES + model.num_layers * COMPILED_STEP_LAYER_BYTES


def compiled_step_bytes(config: EngineConfig, model: ModelConfig) -> int:
    """The documented allowance for compiled code on the device (module doc)."""
    return compiled_step_programs(config) * compiled_program_bytes(model) + COMPILED_OTHER_BYTES


@dataclasses.dataclass(frozen=True)
class CapacityPlan:
    """Everything `plan_capacity` decided, with the numbers it decided from (bytes unless named)."""

    model: str
    model_type: str
    dtype: str
    itemsize: int
    max_concurrency: int
    max_context: int
    chunk_size: int
    backend: str
    # The budget.
    source: str  # SOURCES: where the device's memory came from
    device: str  # the device as its backend names it, or "" for device_memory_bytes
    device_bytes: int | None  # D (None: the default budget, no statistics)
    device_in_use_bytes: int | None  # bytes_in_use as reported (memory_stats only)
    in_use_charged_bytes: int  # what others hold, charged against the budget
    device_memory_fraction: float
    usable_bytes: int | None  # floor(D × fraction) - in use; None for the default
    budget_bytes: int  # what the ledger solves against: usable, or the default for the pools
    charged: bool  # False: the default budget, weights/workspace/compiled not charged
    # What it holds.
    parameters: int
    weights_bytes: int
    workspace: Workspace
    compiled_step_bytes: int
    compiled_step_programs: int
    compiled_program_bytes: int
    backend_pools: tuple[tuple[int, int], ...]  # (page_tokens, page_bytes) per backend KV pool
    backend_pool_bytes: int
    state_slots: int
    state_slot_bytes: int
    kv_pages: int
    kv_page_bytes: int
    kv_page_range: tuple[int, int]  # CFG-6 (lower, upper) bounds in pages
    kv_limited_by: str  # "CFG-6 upper bound" | "device memory" | "default budget" | "kv_capacity"
    host_arena_bytes: int
    pages_per_request: int
    # The cache byte budget (split_cache_bytes): the default StateImage share for this plan's
    # pool bytes (or --cache_device_bytes), the split it gives, and with --cache_device_bytes
    # the split asked for (--split, else the default).
    default_split: float = 0.0
    default_split_pools: "CacheSplit | None" = None
    cache: "CacheSplit | None" = None

    @property
    def pool_bytes(self) -> int:
        """Main KV, StateImage slots and backend pools: what a cache byte budget shares."""
        return self.kv_bytes + self.state_bytes + self.backend_pool_bytes

    @property
    def kv_tokens(self) -> int:
        return self.kv_pages * cap.PAGE_TOKENS

    @property
    def kv_bytes(self) -> int:
        return self.kv_pages * self.kv_page_bytes

    @property
    def state_bytes(self) -> int:
        return self.state_slots * self.state_slot_bytes

    @property
    def charged_bytes(self) -> int:
        """Bytes charged against `budget_bytes`."""
        fixed = self.weights_bytes + self.workspace.bytes + self.compiled_step_bytes if self.charged else 0
        return fixed + self.kv_bytes + self.state_bytes + self.backend_pool_bytes

    @property
    def free_bytes(self) -> int:
        return self.budget_bytes - self.charged_bytes

    @property
    def capacity(self) -> Capacity:
        return Capacity(kv_pages=self.kv_pages, state_slots=self.state_slots,
                        host_capacity_bytes=self.host_arena_bytes, pages_per_request=self.pages_per_request,
                        mtp_pages=sum(cap.backend_pages(self.kv_pages, pt) for pt, _ in self.backend_pools))

    def as_dict(self) -> dict[str, Any]:
        """One JSON object (`ninfer plan --json`)."""
        ws = self.workspace
        return {
            "model": self.model, "model_type": self.model_type, "dtype": self.dtype, "itemsize": self.itemsize,
            "max_concurrency": self.max_concurrency, "max_context": self.max_context,
            "chunk_size": self.chunk_size, "backend": self.backend,
            "budget": {"source": self.source, "device": self.device, "device_bytes": self.device_bytes,
                       "device_in_use_bytes": self.device_in_use_bytes,
                       "in_use_charged_bytes": self.in_use_charged_bytes,
                       "device_memory_fraction": self.device_memory_fraction, "usable_bytes": self.usable_bytes,
                       "budget_bytes": self.budget_bytes, "charged": self.charged,
                       "charged_bytes": self.charged_bytes, "free_bytes": self.free_bytes},
            "weights": {"parameters": self.parameters, "bytes": self.weights_bytes, "charged": self.charged},
            "main_kv": {"pages": self.kv_pages, "tokens": self.kv_tokens, "page_bytes": self.kv_page_bytes,
                        "bytes": self.kv_bytes, "min_pages": self.kv_page_range[0],
                        "max_pages": self.kv_page_range[1], "limited_by": self.kv_limited_by,
                        "pages_per_request": self.pages_per_request},
            "state_slots": {"count": self.state_slots, "bytes_each": self.state_slot_bytes,
                            "bytes": self.state_bytes},
            "backend_pools": {"pools": [list(p) for p in self.backend_pools], "bytes": self.backend_pool_bytes},
            "workspace": {"bytes": ws.bytes, "prefill_bytes": ws.prefill_bytes, "decode_bytes": ws.decode_bytes,
                          "decode_rows": ws.decode_rows, "store_bytes": ws.store_bytes,
                          "store_pages": ws.store_pages, "charged": self.charged},
            "compiled_steps": {"bytes": self.compiled_step_bytes, "programs": self.compiled_step_programs,
                               "bytes_per_program": self.compiled_program_bytes, "charged": self.charged},
            "host_arena_bytes": self.host_arena_bytes,
            "split": self._split_dict(),
            **({"cache": self.cache.as_dict()} if self.cache is not None else {}),
        }

    def _split_dict(self) -> dict[str, Any]:
        at = self.default_split_pools
        return {"default": self.default_split, "rule": DEFAULT_SPLIT_RULE,
                "pool_bytes": at.cache_device_bytes if at is not None else self.pool_bytes,
                "state_slots": at.state_slots if at is not None else None,
                "kv_pages": at.kv_pages if at is not None else None}

    def _split_row(self) -> str:
        at = self.default_split_pools
        where = (f"; {size(at.cache_device_bytes)} of pools at S would be {at.state_slots:,} StateImage slots + "
                 f"{at.kv_pages:,} Main KV pages" if at is not None else "")
        return f"S = {self.default_split:.4g}, {DEFAULT_SPLIT_RULE}{where}"

    def text(self) -> str:
        """The plan as aligned lines, `label  size  how` (`ninfer plan`)."""
        ws = self.workspace
        lo, hi = self.kv_page_range
        nc = "" if self.charged else "; not charged (no device statistics)"
        rows = []
        if self.source == "default":
            rows.append(("device memory", None, f"{self.device}: no memory statistics; the pools get the "
                                                f"default {size(self.budget_bytes)} budget (CFG-2)"))
        else:
            where = "--device_memory_bytes" if self.source == "device_memory_bytes" else f"{self.device} bytes_limit"
            rows.append(("device memory", self.device_bytes, f"{self.device_bytes:,} B ({where})"))
            if self.source == "memory_stats":
                rows.append(("in use by others", self.in_use_charged_bytes,
                             f"bytes_in_use {self.device_in_use_bytes:,} B less this engine's own weights"))
            minus = " - in use by others" if self.source == "memory_stats" else ""
            rows.append(("usable", self.usable_bytes, f"{self.usable_bytes:,} B = device memory × "
                                                      f"device_memory_fraction {self.device_memory_fraction:g}{minus}"))
        rows += [
            ("weights", self.weights_bytes, f"{self.parameters:,} parameters × {self.itemsize} B{nc}"),
            ("Main KV", self.kv_bytes, f"{self.kv_pages:,} pages × {size(self.kv_page_bytes)} = {self.kv_tokens:,} "
                                       f"tokens; {self.kv_limited_by} (CFG-6 range {lo:,}..{hi:,} pages)"),
            ("StateImage slots", self.state_bytes, f"{self.state_slots} × {size(self.state_slot_bytes)} "
                                                   f"({self.state_slot_bytes:,} B): {self.max_concurrency} basic + "
                                                   f"{self.state_slots - self.max_concurrency} device_state_slots"),
            ("backend pools", self.backend_pool_bytes, ", ".join(
                f"{pt}-token pages of {pb:,} B" for pt, pb in self.backend_pools) or "none built"),
            ("workspace", ws.bytes, f"the largest of prefill 1 × {self.chunk_size} tokens {size(ws.prefill_bytes)}, "
                                    f"decode {ws.decode_rows} rows {size(ws.decode_bytes)}, one request's context "
                                    f"to the Host ({ws.store_pages:,} pages + 1 StateImage) {size(ws.store_bytes)}{nc}"),
            ("compiled steps", self.compiled_step_bytes,
             f"{self.compiled_step_programs} step programs × {size(self.compiled_program_bytes)} + "
             f"{size(COMPILED_OTHER_BYTES)} (an allowance){nc}"),
            ("free", self.free_bytes, f"{self.free_bytes:,} B of the {self.budget_bytes:,} B budget unused"),
            ("Host arena", self.host_arena_bytes, "host memory (CFG-5), not on the device"),
            ("default split", None, self._split_row()),
        ]
        if self.cache is not None:
            rows.append(("cache bytes", self.cache.cache_device_bytes, self.cache.text()))
        head = (f"ninfer plan: {self.model} ({self.model_type}), {self.dtype}, C={self.max_concurrency}, "
                f"max_context={self.max_context}, chunk_size={self.chunk_size}, backend={self.backend}")
        width = max(len(k) for k, _, _ in rows)
        sizes = [size(n) if n is not None else "" for _, n, _ in rows]
        col = max(len(x) for x in sizes)
        return "\n".join([head] + [f"{k:<{width}}  {x:>{col}}  {how}" for (k, _, how), x in zip(rows, sizes)])


def size(n: int | None) -> str:
    """Bytes in binary units, two decimals: "148.40 GiB", "1.50 MiB", "0 B"."""
    if n is None:
        return "-"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def usable_bytes(device_bytes: int, fraction: float) -> int:
    """floor(device_bytes × fraction), exact for the decimal the fraction was written as (CFG-2)."""
    return int(Fraction(device_bytes) * Fraction(repr(float(fraction))))


def speculative_pools(config: EngineConfig, model: ModelConfig, itemsize: int) -> tuple[tuple[int, int], ...]:
    """The backend KV pools of `config` (RES-1): with `speculative_tokens`, the MTP layers' K/V in
    64-token pages of their own geometry, as many tokens as the Main KV (spec_steps.MTP_POOL);
    else none. A ConfigError when the model has no MTP layers."""
    if not config.speculative_tokens:
        return ()
    n = model.mtp_num_hidden_layers
    if not n:
        raise ConfigError("speculative_tokens", f"{config.model} has no MTP head (config mtp_num_hidden_layers "
                                                "is 0): speculative decoding needs one; use 0")
    return ((cap.PAGE_TOKENS, n * 2 * model.num_key_value_heads * model.head_dim * itemsize * cap.PAGE_TOKENS),)


def plan_capacity(config: EngineConfig, model: ModelConfig, itemsize: int, *, device=None,
                  resident_bytes: int = 0) -> CapacityPlan:
    """The capacity plan of `config` on `model` at `itemsize` bytes per element, or a ConfigError:
    `device_memory_bytes` when the weights alone exceed the usable memory, `kv_capacity` when the
    Main KV cannot have its CFG-6 lower bound (or an explicit capacity is out of range or does not
    fit). `device`: a `DeviceMemory` or a `jax.Device` (default: the first local device is asked,
    unless `config.device_memory_bytes` is set); `resident_bytes`: this engine's weights already
    on it."""
    c = config.max_concurrency
    slots = cap.state_slot_count(c, config.context_cache.device_state_slots)
    page_bytes = max(model.kv_bytes_per_token(itemsize) * cap.PAGE_TOKENS, 1)
    state_bytes = model.state_image_bytes(itemsize)
    parameters = model.param_count()
    weights = parameters * itemsize
    ws = workspace(config, model, itemsize)
    compiled = compiled_step_bytes(config, model)
    backend_pools = speculative_pools(config, model, itemsize)

    # CFG-2: where the device's memory comes from.
    in_use_reported = None
    in_use = 0
    if config.device_memory_bytes is not None:
        source, name, total = "device_memory_bytes", "", config.device_memory_bytes
    else:
        from ninfer_jax.program.device_memory import DeviceMemory, describe, query

        device = query() if device is None else device if isinstance(device, DeviceMemory) else describe(device)
        name = device.device
        if device.has_stats:
            source, total = "memory_stats", device.bytes_limit
            in_use_reported = device.bytes_in_use
            in_use = max(0, device.bytes_in_use - max(0, resident_bytes))
        else:
            source, total = "default", None
    charged = total is not None
    if charged:
        usable = usable_bytes(total, config.device_memory_fraction) - in_use
        budget_bytes = max(0, usable)
        if weights > usable:
            short = f" less {in_use:,} B in use by others" if in_use else ""
            raise ConfigError("device_memory_bytes", (
                f"the weights alone need {weights:,} B ({size(weights)}: {parameters:,} parameters × {itemsize} B) "
                f"but the device budget is {max(usable, 0):,} B ({size(max(usable, 0))}) = "
                f"{config.device_memory_fraction:g} × {total:,} B ({size(total)}){short} (CFG-2, CFG-6): this model "
                f"needs a device with more memory (or a larger device_memory_fraction, at most 1)"))
    else:
        usable, budget_bytes = None, DEFAULT_DEVICE_BUDGET
    budget = cap.DeviceBudget(
        budget_bytes=budget_bytes, main_page_bytes=page_bytes, state_slot_bytes=state_bytes, state_slots=slots,
        workspace_bytes=ws.bytes if charged else 0, compiled_step_bytes=compiled if charged else 0,
        backend_pools=backend_pools, weights_bytes=weights if charged else 0)
    lo, hi = cap.kv_page_range(config.max_context, c)
    try:
        if config.kv_capacity is None:
            pages = cap.solve_kv_pages(budget, config.max_context, c)
            limited_by = "CFG-6 upper bound" if pages == hi else ("device memory" if charged else "default budget")
        else:
            # CFG-6: an explicit capacity must fit device memory too, where the device is known;
            # the CPU default budget sizes solved capacities only.
            pages = cap.resolve_kv_pages(config.kv_capacity, config.max_context, c, budget if charged else None)
            limited_by = "kv_capacity"
    except cap.CapacityConfigError as e:
        raise ConfigError("kv_capacity", str(e)) from None
    host = config.context_cache.host_capacity_bytes
    if host is None:
        host = cap.default_host_capacity_bytes(state_bytes)
    backend_bytes = sum(cap.backend_pages(pages, pt) * pb for pt, pb in backend_pools)
    pool_bytes = pages * page_bytes + slots * state_bytes + backend_bytes
    share = default_split(model, itemsize, config.max_context, c, pool_bytes)
    try:
        at = split_cache_bytes(model, itemsize, pool_bytes, c, split=share, split_source="default rule",
                               max_context=config.max_context, backend_pools=backend_pools)
    except ConfigError:  # pools too small for C slots and C pages at the default share: shown without
        at = None
    return CapacityPlan(
        model=config.model, model_type=model.model_type, dtype=_dtype_name(itemsize), itemsize=itemsize,
        max_concurrency=c, max_context=config.max_context, chunk_size=config.chunk_size, backend=config.backend,
        source=source, device=name, device_bytes=total, device_in_use_bytes=in_use_reported,
        in_use_charged_bytes=in_use, device_memory_fraction=config.device_memory_fraction, usable_bytes=usable,
        budget_bytes=budget_bytes, charged=charged, parameters=parameters, weights_bytes=weights, workspace=ws,
        compiled_step_bytes=compiled, compiled_step_programs=compiled_step_programs(config),
        compiled_program_bytes=compiled_program_bytes(model),
        backend_pools=backend_pools,
        backend_pool_bytes=backend_bytes,
        state_slots=slots, state_slot_bytes=state_bytes, kv_pages=pages, kv_page_bytes=page_bytes,
        kv_page_range=(lo, hi), kv_limited_by=limited_by, host_arena_bytes=host,
        pages_per_request=cap.pages_for_tokens(config.max_context), default_split=share, default_split_pools=at)


def with_cache_bytes(plan: CapacityPlan, model: ModelConfig, cache_device_bytes: int,
                     split: float | None = None, *, max_context_given: bool = True) -> CapacityPlan:
    """`ninfer plan --cache_device_bytes=N [--split=S]`: the plan with N split between the pools
    as `ninfer trace` would, and the default split for N. The plan's `max_context` is kept when
    `max_context_given` (Main KV then stops at its CFG-6 upper bound), else it is the base that
    the pool raises (`split_cache_bytes`). ConfigError naming the flag when N cannot be split."""
    given = plan.max_context if max_context_given else None
    kw = dict(max_context=given, fallback_max_context=plan.max_context, backend_pools=plan.backend_pools)
    share = default_split(model, plan.itemsize, plan.max_context, plan.max_concurrency, cache_device_bytes)
    try:
        at = split_cache_bytes(model, plan.itemsize, cache_device_bytes, plan.max_concurrency, split=share,
                               split_source="default rule", **kw)
    except ConfigError:
        if split is None:
            raise
        at = None  # the default cannot split N; the split asked for may
    cache = at if split is None else split_cache_bytes(model, plan.itemsize, cache_device_bytes,
                                                       plan.max_concurrency, split=split, **kw)
    return dataclasses.replace(plan, default_split=share, default_split_pools=at, cache=cache)


def _dtype_name(itemsize: int) -> str:
    return {2: "bfloat16", 4: "float32"}.get(itemsize, f"{itemsize}-byte")


# ---- one cache byte budget shared by the pools (ninfer trace --cache_device_bytes) -----------------
DEFAULT_SPLIT_CONTEXT_SHARE = 4  # the default split: one StateImage per max_context / 4 of Main KV
DEFAULT_SPLIT_RULE = ("one StateImage per max_context/4 of Main KV, 2C slots at least and one max_context of "
                      "Main KV kept where the bytes allow (the StateImage share ninfer trace --cache_device_bytes "
                      "uses without --split)")
MAX_EXTRA_STATE_SLOTS = 4096  # CFG-4: ContextCacheConfig.device_state_slots' bound, beyond the C basic


def default_split(model: ModelConfig, itemsize: int, max_context: int, max_concurrency: int,
                  cache_device_bytes: int | None = None) -> float:
    """The StateImage share of a cache byte budget when none is given (module doc): one
    StateImage per quarter `max_context` of Main KV, s / (s + ceil(max_context/4/64) × page
    bytes). With `cache_device_bytes` N known, bounded so that Main KV keeps one `max_context`
    (max(C, ceil(max_context/64)) pages, CFG-6): raised to the CFG-4 default of 2C slots only as
    far as that allows, lowered to it where needed, and C slots exactly when even those leave
    less (the replay then needs --skip_too_long). A budget too small for C slots and C pages is
    refused by `split_cache_bytes`, not here."""
    slot = model.state_image_bytes(itemsize)
    page = max(model.kv_bytes_per_token(itemsize) * cap.PAGE_TOKENS, 1)
    quarter = cap.pages_for_tokens(cap.ceil_div(max_context, DEFAULT_SPLIT_CONTEXT_SHARE))
    share = slot / (slot + quarter * page) if slot else 0.0
    if cache_device_bytes:
        n, c = cache_device_bytes, max_concurrency
        basic, default_slots = c * slot / n, 2 * c * slot / n  # C basic slots; CFG-4's default 2C
        one_context = 1 - max(c, cap.pages_for_tokens(max_context)) * page / n  # leaves one max_context
        share = min(max(share, min(default_slots, one_context)), one_context) if one_context >= basic else basic
    return max(min(share, 0.99), 1e-6)


def check_split(split: float, flag: str = "split") -> float:
    """S must be a number strictly between 0 and 1 (ConfigError naming `flag`)."""
    if isinstance(split, bool) or not isinstance(split, (int, float)) or not 0 < split < 1:
        raise ConfigError(flag, f"the StateImage share of --cache_device_bytes must be a number in (0, 1), got "
                                f"{split!r}")
    return float(split)


def check_cache_device_bytes(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError("cache_device_bytes", f"must be a positive number of bytes, got {n!r}")
    return n


@dataclasses.dataclass(frozen=True)
class CacheSplit:
    """N cache bytes split between StateImage slots and Main KV (with its backend pools), and
    the `max_context` that goes with the pool (CFG-6)."""

    cache_device_bytes: int  # N
    split: float  # S, the StateImage share asked for
    split_source: str  # "--split" | "default rule" | "--split_sweep"
    max_concurrency: int
    state_slots: int
    state_slot_bytes: int
    kv_pages: int
    kv_page_bytes: int
    backend_pools: tuple[tuple[int, int], ...]
    backend_pool_bytes: int
    max_context: int
    max_context_source: str  # how max_context was chosen (docs/trace.md)
    longest_request: int | None  # tokens (prompt + output) of the longest request, where known
    limited_by: str  # what sized Main KV: "cache bytes" | "CFG-6 upper bound"

    @property
    def state_bytes(self) -> int:
        return self.state_slots * self.state_slot_bytes

    @property
    def kv_bytes(self) -> int:
        return self.kv_pages * self.kv_page_bytes

    @property
    def kv_tokens(self) -> int:
        return self.kv_pages * cap.PAGE_TOKENS

    @property
    def used_bytes(self) -> int:
        return self.state_bytes + self.kv_bytes + self.backend_pool_bytes

    @property
    def unused_bytes(self) -> int:
        return self.cache_device_bytes - self.used_bytes

    def capacity(self, host_capacity_bytes: int) -> Capacity:
        return Capacity(kv_pages=self.kv_pages, state_slots=self.state_slots,
                        host_capacity_bytes=host_capacity_bytes,
                        pages_per_request=cap.pages_for_tokens(self.max_context))

    def as_dict(self) -> dict[str, Any]:
        return {"cache_device_bytes": self.cache_device_bytes, "split": self.split,
                "split_source": self.split_source, "state_share": round(self.state_bytes / self.cache_device_bytes, 6),
                "state_slots": self.state_slots, "state_slot_bytes": self.state_slot_bytes,
                "state_bytes": self.state_bytes, "basic_slots": self.max_concurrency,
                "kv_pages": self.kv_pages, "kv_page_bytes": self.kv_page_bytes, "kv_bytes": self.kv_bytes,
                "kv_tokens": self.kv_tokens, "kv_limited_by": self.limited_by,
                "backend_pool_bytes": self.backend_pool_bytes, "unused_bytes": self.unused_bytes,
                "max_context": self.max_context, "max_context_source": self.max_context_source,
                "longest_request": self.longest_request}

    def text(self) -> str:
        """One line: `S=0.25 (--split): 16 StateImages × 73.69 MiB + 2,048 pages × 1.50 MiB ...`."""
        return (f"S={self.split:.4g} ({self.split_source}) of {size(self.cache_device_bytes)}: "
                f"{self.state_slots:,} StateImage slots × {size(self.state_slot_bytes)} = {size(self.state_bytes)} "
                f"({self.max_concurrency} basic), {self.kv_pages:,} Main KV pages × {size(self.kv_page_bytes)} = "
                f"{size(self.kv_bytes)} ({self.kv_tokens:,} tokens), backend {size(self.backend_pool_bytes)}, "
                f"unused {size(self.unused_bytes)}; max_context {self.max_context:,} ({self.max_context_source})")


def _kv_fit(room: int, page_bytes: int, backend_pools: tuple[tuple[int, int], ...]) -> int:
    """The largest Main KV page count whose pages and backend pools fit `room` bytes."""
    def need(p: int) -> int:
        return p * page_bytes + sum(cap.backend_pages(p, pt) * pb for pt, pb in backend_pools)

    lo, hi = 0, max(0, room) // page_bytes
    while lo < hi:  # need() is monotone in p
        mid = (lo + hi + 1) // 2
        if need(mid) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def split_cache_bytes(model: ModelConfig, itemsize: int, cache_device_bytes: int, max_concurrency: int, *,
                      split: float | None = None, split_source: str | None = None, max_context: int | None = None,
                      longest_request: int | None = None, fallback_max_context: int = 2048,
                      skip_too_long: bool = False,
                      backend_pools: tuple[tuple[int, int], ...] = ()) -> CacheSplit:
    """Split `cache_device_bytes` between the pools at StateImage share `split` (None: the
    default rule) and choose `max_context` (docs/trace.md, "The cache byte budget"):

    - `max_context` given (--max_context): kept; Main KV is capped at its CFG-6 upper bound
      C × ceil(max_context/64) (the rest of N stays unused);
    - else the longest request (`longest_request`, else `fallback_max_context`), raised to
      64 × ceil(pages / C) when the pool is larger than C such contexts (CFG-6 upper bound).
    Main KV below one `max_context` (CFG-6 lower bound) is a ConfigError naming the flags, or
    with `skip_too_long` bounds `max_context` to the pool's pages × 64 tokens (the requests
    beyond it are reported, not replayed). ConfigErrors name --split or --cache_device_bytes
    for a budget that cannot hold C basic StateImage slots and C pages."""
    n = check_cache_device_bytes(cache_device_bytes)
    c = cap.check_concurrency(max_concurrency)
    slot = model.state_image_bytes(itemsize)
    page = max(model.kv_bytes_per_token(itemsize) * cap.PAGE_TOKENS, 1)
    base = max_context if max_context is not None else longest_request or fallback_max_context
    if split is None:
        split, split_source = default_split(model, itemsize, base, c, n), split_source or "default rule"
    split = check_split(split)
    minimum = c * slot + c * page  # C basic StateImages (CFG-4) and C pages (CFG-6)
    if n < minimum:
        raise ConfigError("cache_device_bytes", (
            f"{n:,} B ({size(n)}) cannot hold the C = {c} basic StateImage slots of {slot:,} B (CFG-4) and "
            f"{c} Main KV pages of {page:,} B (CFG-6): at least {minimum:,} B ({size(minimum)})"))
    slots = min(int(split * n / slot + 1e-9) if slot else c + MAX_EXTRA_STATE_SLOTS, c + MAX_EXTRA_STATE_SLOTS)
    if slots < c:
        raise ConfigError("split", (
            f"S = {split:g} gives the StateImages {int(split * n):,} B of {n:,} B: {slots} slots of {size(slot)}, "
            f"fewer than the C = {c} basic ones (CFG-4); S must be at least {c * slot / n:.4g} here"))
    pages = _kv_fit(n - slots * slot, page, backend_pools)
    if pages < c:
        raise ConfigError("split", (
            f"S = {split:g} leaves Main KV {n - slots * slot:,} B: {pages} pages of {size(page)}, fewer than "
            f"C = {c} (CFG-6); S must be at most {1 - c * page / n:.4g} here"))
    limited_by = "cache bytes"
    if max_context is not None:
        mc, how = max_context, "--max_context"
        hi = c * cap.pages_for_tokens(mc)
        if pages > hi:
            pages, limited_by = hi, "CFG-6 upper bound"
    else:
        mc = base
        how = "the trace's longest request" if longest_request else "max_context's default"
        raised = cap.PAGE_TOKENS * cap.ceil_div(pages, c)
        if raised > mc and pages >= cap.pages_for_tokens(mc):
            mc, how = raised, (f"{how} ({base:,}), raised so that C × ceil(max_context/64) ≥ {pages:,} pages "
                               f"(CFG-6 upper bound)")
        else:
            how = f"{how} ({base:,})"
    if pages < cap.pages_for_tokens(mc):
        held = pages * cap.PAGE_TOKENS
        if not skip_too_long:
            what = (f"the longest request ({longest_request:,} tokens)" if max_context is None and longest_request
                    else f"max_context = {mc:,}")
            need = cap.pages_for_tokens(mc)
            most = 1 - need * page / n  # the largest share that leaves `need` pages
            least = c * slot + need * page
            fix = (f"a --split of at most {most:.4g}" if most >= c * slot / n else
                   f"at least {least:,} B ({size(least)}: C slots and {need:,} pages)")
            raise ConfigError("cache_device_bytes", (
                f"at S = {split:g}, {size(n)} leaves Main KV {pages:,} pages = {held:,} tokens, below {what}: "
                f"CFG-6 needs ceil(max_context/64) = {need:,} pages; give {fix}, or --skip_too_long to replay the "
                f"requests that fit and report the rest"))
        mc, how = held, f"bounded by the pool's {pages:,} pages (--skip_too_long)"
    backend = sum(cap.backend_pages(pages, pt) * pb for pt, pb in backend_pools)
    return CacheSplit(cache_device_bytes=n, split=split, split_source=split_source or "--split", max_concurrency=c,
                      state_slots=slots, state_slot_bytes=slot, kv_pages=pages, kv_page_bytes=page,
                      backend_pools=backend_pools, backend_pool_bytes=backend, max_context=mc,
                      max_context_source=how, longest_request=longest_request, limited_by=limited_by)
