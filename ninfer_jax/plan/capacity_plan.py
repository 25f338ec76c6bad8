"""`plan_capacity`: a config and the model's geometry in, one `CapacityPlan` out (CFG-2..6).

The plan is formed in one pass, each figure once, in this order:

1. the geometry: what the model puts in a Main KV page, a StateImage, its weights, and the
   backend KV pools the config adds (`pools.speculative_pools`);
2. the steps the Program compiles (`workspace.decode_buckets`) and what they take on the
   device: the workspace and the compiled-code allowance (`workspace.py`);
3. the budget: the device's memory and what of it may be filled (`budget.py`), or N cache
   bytes shared by the pools (`CacheBytes`, `split.py`);
4. the pools, sized by the ledger's capacity rules (`ledger/capacity.py`): Main KV in its CFG-6
   range, the StateImage slots (CFG-4), the Host arena (CFG-5);
5. the split of those pool bytes between StateImages and Main KV (`split.py`).

Every consumer reads the value: the Program and the cost-model Program build their pools from
`plan.capacity` and compile `plan.decode_buckets`; `ninfer plan` prints it (`report.py`);
`ninfer trace --cache_device_bytes` sizes its pools with `CacheBytes`. It reads the model's
geometry only (a `ModelConfig`), never its weights.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ledger import capacity as cap
from ninfer_jax.config import EngineConfig
from ninfer_jax.errors import ConfigError
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.plan import report
from ninfer_jax.plan.budget import Budget, device_budget
from ninfer_jax.plan.pools import Capacity, backend_pool_bytes, speculative_pools
from ninfer_jax.plan.split import CacheSplit, default_split, split_cache_bytes
from ninfer_jax.plan.workspace import (COMPILED_OTHER_BYTES, Workspace, compiled_program_bytes, decode_buckets,
                                       prefill_chunk_lengths, prefill_table_widths, step_programs, workspace)


@dataclasses.dataclass(frozen=True)
class CacheBytes:
    """N device bytes shared by the pools instead of the device solve (`ninfer trace
    --cache_device_bytes=N`): the StateImage share `split` (None: the default rule), and how
    `max_context` is chosen (`split.split_cache_bytes`)."""

    cache_device_bytes: int
    split: float | None = None
    split_source: str | None = None  # "--split" | "default rule" | "--split_sweep"
    max_context_given: bool = True  # keep the config's max_context; else the longest request, raised for CFG-6
    longest_request: int | None = None  # tokens (prompt + output) of the longest request, where known
    skip_too_long: bool = False  # bound max_context by the pool instead of refusing


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
    source: str  # budget.SOURCES, or "cache_device_bytes": where the pools' bytes came from
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
    # "CFG-6 upper bound" | "device memory" | "default budget" | "kv_capacity" | "cache bytes"
    kv_limited_by: str
    host_arena_bytes: int
    pages_per_request: int
    # The cache byte budget (split_cache_bytes): the default StateImage share for this plan's
    # pool bytes (or --cache_device_bytes), the split it gives, and with --cache_device_bytes
    # the split asked for (--split, else the default).
    default_split: float = 0.0
    default_split_pools: CacheSplit | None = None
    cache: CacheSplit | None = None
    decode_buckets: tuple[int, ...] = ()  # the decode steps' row buckets the Program compiles
    prefill_widths: tuple[int, ...] = ()  # the prefill chunk's page-table widths it compiles
    prefill_lengths: tuple[int, ...] = ()  # the prefill chunk's token lengths it compiles
    # CFG-6: the config's max_context where an explicit kv_capacity below it lowered `max_context`
    # to the Main KV's tokens (None: not lowered).
    max_context_lowered_from: int | None = None

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
        """The pool sizes the Program builds."""
        return Capacity(kv_pages=self.kv_pages, state_slots=self.state_slots,
                        host_capacity_bytes=self.host_arena_bytes, pages_per_request=self.pages_per_request,
                        mtp_pages=sum(cap.backend_pages(self.kv_pages, pt) for pt, _ in self.backend_pools))

    def reasons(self) -> dict[str, str]:
        """Each figure's reason, by the label `ninfer plan` prints it under."""
        return {label: how for label, _, how in report.rows(self)}

    def as_dict(self) -> dict[str, Any]:
        """One JSON object (`ninfer plan --json`)."""
        return report.as_dict(self)

    def text(self) -> str:
        """The plan as aligned lines, `label  size  how` (`ninfer plan`)."""
        return report.text(self)


def plan_capacity(config: EngineConfig, model: ModelConfig, itemsize: int, *, device=None, resident_bytes: int = 0,
                  cache_bytes: CacheBytes | None = None) -> CapacityPlan:
    """The capacity plan of `config` on `model` at `itemsize` bytes per element, or a ConfigError:
    `device_memory_bytes` when the weights alone exceed the usable memory, `kv_capacity` when the
    Main KV cannot have its CFG-6 lower bound (or an explicit capacity is out of range or does not
    fit). `device`: a `DeviceMemory` or a `jax.Device` (default: the first local device is asked,
    unless `config.device_memory_bytes` is set); `resident_bytes`: this engine's weights already
    on it. `cache_bytes`: the pools share these bytes instead (the device is not asked; the
    ConfigErrors are `split_cache_bytes`')."""
    c = config.max_concurrency
    # 1. The geometry.
    kv_page = model.kv_bytes_per_token(itemsize) * cap.PAGE_TOKENS
    page_bytes = max(kv_page, 1)  # the ledger's unit: a model without attention still has 1-byte pages
    state_bytes = model.state_image_bytes(itemsize)
    parameters = model.param_count()
    weights = parameters * itemsize
    backend_pools = speculative_pools(config, model, itemsize)
    # N cache bytes decide the pools, and with them max_context (CFG-6), before the steps are sized.
    split_kw = _split_kw(config, cache_bytes, backend_pools)
    asked = None
    if cache_bytes is not None:
        asked = split_cache_bytes(model, itemsize, cache_bytes.cache_device_bytes, c, split=cache_bytes.split,
                                  split_source=cache_bytes.split_source, **split_kw)
    max_context = asked.max_context if asked is not None else config.max_context
    per_request = cap.pages_for_tokens(max_context)
    lowered_from = None
    if asked is None and config.kv_capacity is not None:
        # CFG-6 (this project): an explicit Main KV below one max_context lowers what a request
        # may reach to the tokens it holds, instead of refusing to start; a request longer than
        # that is refused at submission, typed (it could never run: its KV must all be on the device).
        k = config.kv_capacity
        explicit = cap.pages_for_tokens(k) if type(k) is int and k >= 1 else None  # else refused below
        if explicit is not None and explicit < c:
            raise ConfigError("kv_capacity", f"{k:,} tokens = {explicit} Main KV page{'s' * (explicit != 1)} of {cap.PAGE_TOKENS} tokens, "
                                             f"fewer than C = {c}: CFG-6 gives each lane a page at least")
        if explicit is not None and explicit < per_request:
            lowered_from, max_context, per_request = max_context, explicit * cap.PAGE_TOKENS, explicit
    # 2. The steps the Program compiles, and what they take.
    buckets = decode_buckets(c)
    ws = workspace(model, itemsize, chunk_size=config.chunk_size, decode_rows=buckets[-1],
                   pages_per_request=per_request, page_bytes=kv_page, state_image_bytes=state_bytes,
                   backend=config.backend)
    widths = prefill_table_widths(per_request, config.chunk_size, config.backend)
    lengths = prefill_chunk_lengths(config.chunk_size)
    programs = step_programs(buckets, bool(config.speculative_tokens), len(widths), len(lengths))
    program_bytes = compiled_program_bytes(model)
    compiled = programs * program_bytes + COMPILED_OTHER_BYTES
    # 3. The budget, and 4. the pools in it.
    lo, hi = cap.kv_page_range(max_context, c)
    if asked is not None:
        budget = Budget(source="cache_device_bytes", device="", device_bytes=None, device_in_use_bytes=None,
                        in_use_charged_bytes=0, usable_bytes=None, budget_bytes=asked.cache_device_bytes,
                        charged=False)
        slots, pages, limited_by = asked.state_slots, asked.kv_pages, asked.limited_by
    else:
        budget = device_budget(config, weights_bytes=weights, parameters=parameters, itemsize=itemsize,
                               device=device, resident_bytes=resident_bytes)
        slots = cap.state_slot_count(c, config.context_cache.device_state_slots)
        pages, limited_by = _main_kv(config, budget, cap.DeviceBudget(
            budget_bytes=budget.budget_bytes, main_page_bytes=page_bytes, state_slot_bytes=state_bytes,
            state_slots=slots, workspace_bytes=ws.bytes if budget.charged else 0,
            compiled_step_bytes=compiled if budget.charged else 0, backend_pools=backend_pools,
            weights_bytes=weights if budget.charged else 0), hi, max_context)
    host = config.context_cache.host_capacity_bytes
    if host is None:
        host = cap.default_host_capacity_bytes(state_bytes)
    backend_bytes = backend_pool_bytes(pages, backend_pools)
    # 5. The default split of the pool bytes between StateImages and Main KV (N's, with N given).
    if asked is not None and asked.split_source == "default rule":
        share, at = asked.split, asked  # what was asked is the default
    elif asked is not None:
        share, at = _default_split_of(model, itemsize, c, asked.cache_device_bytes, split_kw)
    else:
        share, at = _default_split_of(model, itemsize, c, pages * page_bytes + slots * state_bytes + backend_bytes,
                                      dict(max_context=max_context, backend_pools=backend_pools))
    return CapacityPlan(
        model=config.model, model_type=model.model_type, dtype=_dtype_name(itemsize), itemsize=itemsize,
        max_concurrency=c, max_context=max_context, chunk_size=config.chunk_size, backend=config.backend,
        source=budget.source, device=budget.device, device_bytes=budget.device_bytes,
        device_in_use_bytes=budget.device_in_use_bytes, in_use_charged_bytes=budget.in_use_charged_bytes,
        device_memory_fraction=config.device_memory_fraction, usable_bytes=budget.usable_bytes,
        budget_bytes=budget.budget_bytes, charged=budget.charged, parameters=parameters, weights_bytes=weights,
        workspace=ws, compiled_step_bytes=compiled, compiled_step_programs=programs,
        compiled_program_bytes=program_bytes, backend_pools=backend_pools, backend_pool_bytes=backend_bytes,
        state_slots=slots, state_slot_bytes=state_bytes, kv_pages=pages, kv_page_bytes=page_bytes,
        kv_page_range=(lo, hi), kv_limited_by=limited_by, host_arena_bytes=host, pages_per_request=per_request,
        default_split=share, default_split_pools=at, cache=asked, decode_buckets=buckets,
        prefill_widths=widths, prefill_lengths=lengths, max_context_lowered_from=lowered_from)


def _split_kw(config: EngineConfig, cache_bytes: CacheBytes | None,
              backend_pools: tuple[tuple[int, int], ...]) -> dict[str, Any]:
    """How `split_cache_bytes` chooses max_context for `cache_bytes` (docs/trace.md)."""
    if cache_bytes is None:
        return {}
    return dict(max_context=config.max_context if cache_bytes.max_context_given else None,
                longest_request=cache_bytes.longest_request, fallback_max_context=config.max_context,
                skip_too_long=cache_bytes.skip_too_long, backend_pools=backend_pools)


def _main_kv(config: EngineConfig, budget: Budget, device: cap.DeviceBudget, hi: int,
             max_context: int) -> tuple[int, str]:
    """Main KV pages (the ledger's CFG-2/CFG-6 rules) and what limited them."""
    c = config.max_concurrency
    try:
        if config.kv_capacity is None:
            pages = cap.solve_kv_pages(device, max_context, c)
            return pages, ("CFG-6 upper bound" if pages == hi else
                           "device memory" if budget.charged else "default budget")
        # CFG-6: an explicit capacity must fit device memory too, where the device is known;
        # the CPU default budget sizes solved capacities only.
        pages = cap.resolve_kv_pages(config.kv_capacity, max_context, c, device if budget.charged else None)
        return pages, "kv_capacity"
    except cap.CapacityConfigError as e:
        raise ConfigError("kv_capacity", str(e)) from None


def _default_split_of(model: ModelConfig, itemsize: int, max_concurrency: int, pool_bytes: int,
                      split_kw: dict[str, Any]) -> tuple[float, CacheSplit | None]:
    """The default StateImage share of `pool_bytes` and the split it gives (max_context chosen by
    `split_kw`, as `split_cache_bytes` chooses it), or None where the bytes cannot hold C slots
    and C pages at that share."""
    base = split_kw.get("max_context") or split_kw.get("longest_request") or split_kw.get("fallback_max_context")
    share = default_split(model, itemsize, base, max_concurrency, pool_bytes)
    try:
        return share, split_cache_bytes(model, itemsize, pool_bytes, max_concurrency, split=share,
                                        split_source="default rule", **split_kw)
    except ConfigError:
        return share, None


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


def with_reach(config: EngineConfig, plan: CapacityPlan) -> EngineConfig:
    """`config` with the plan's `max_context`: the same config unless the plan lowered it to
    what an explicit Main KV holds (CFG-6, `max_context_lowered_from`)."""
    if plan.max_context_lowered_from is None or plan.max_context == config.max_context:
        return config
    return dataclasses.replace(config, max_context=plan.max_context)


def resolve_capacity(config: EngineConfig, model: ModelConfig, itemsize: int, *, device=None,
                     resident_bytes: int = 0) -> Capacity:
    """The pool sizes of `plan_capacity` (for a caller that needs nothing else of the plan)."""
    return plan_capacity(config, model, itemsize, device=device, resident_bytes=resident_bytes).capacity


def _dtype_name(itemsize: int) -> str:
    return {2: "bfloat16", 4: "float32"}.get(itemsize, f"{itemsize}-byte")
