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
    + r × 2·S·Hkv·D·4 + 3 × r·Hq·t·S·4 (backend xla/interpret; S = pages per request × 64):
                                       the row's whole page table gathered as float32 K and V,
                                       and the scores, masked scores and probabilities; the
                                       Pallas kernels read pages in place and add nothing here

  store moves: one request's whole context packed on the device for the Host (a Snapshot
  pause at `max_context`, PAUSE-2, or its read-back): pages per request × page bytes + one
  StateImage. Moves of several requests in flight together can exceed it.

  The MoE term assumes a grouped (ragged) matmul, work proportional to top-k; XLA:CPU lowers
  `ragged_dot` densely and needs far more, one more reason the CPU default charges nothing.
- **compiled steps**: an allowance, not a measurement: each model-step program (one prefill
  bucket and every decode bucket) 16 MiB + 1 MiB per layer, plus 64 MiB for the head, the
  stores' movers and the backend's own.
- **backend pools**: backend KV pools (speculative decoding); none are built yet, so 0.
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
        out += 3 * rows * model.num_attention_heads * tokens * s * 4
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
    """Model-step programs compiled at warm-up: one prefill bucket and every decode bucket."""
    from ninfer_jax.program.program import decode_buckets

    return 1 + len(decode_buckets(config.max_concurrency))


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
                        host_capacity_bytes=self.host_arena_bytes, pages_per_request=self.pages_per_request)

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
        }

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
        ]
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
    backend_pools: tuple[tuple[int, int], ...] = ()  # no backend KV pool is built yet (engine.md)

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
    return CapacityPlan(
        model=config.model, model_type=model.model_type, dtype=_dtype_name(itemsize), itemsize=itemsize,
        max_concurrency=c, max_context=config.max_context, chunk_size=config.chunk_size, backend=config.backend,
        source=source, device=name, device_bytes=total, device_in_use_bytes=in_use_reported,
        in_use_charged_bytes=in_use, device_memory_fraction=config.device_memory_fraction, usable_bytes=usable,
        budget_bytes=budget_bytes, charged=charged, parameters=parameters, weights_bytes=weights, workspace=ws,
        compiled_step_bytes=compiled, compiled_step_programs=compiled_step_programs(config),
        compiled_program_bytes=compiled_program_bytes(model),
        backend_pools=backend_pools,
        backend_pool_bytes=sum(cap.backend_pages(pages, pt) * pb for pt, pb in backend_pools),
        state_slots=slots, state_slot_bytes=state_bytes, kv_pages=pages, kv_page_bytes=page_bytes,
        kv_page_range=(lo, hi), kv_limited_by=limited_by, host_arena_bytes=host,
        pages_per_request=cap.pages_for_tokens(config.max_context))


def _dtype_name(itemsize: int) -> str:
    return {2: "bfloat16", 4: "float32"}.get(itemsize, f"{itemsize}-byte")
