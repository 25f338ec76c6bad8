"""Capacity rules (CFG-2..6, RD-11): pure functions the capacity plan (`ninfer_jax/plan/`) calls.

- Main KV is paged in 64-token pages. Its size in pages must lie between
  max(ceil(max_context/64), C) and C × ceil(max_context/64) (CFG-6): one request can hold
  `max_context` alone, and no more than C full contexts are ever useful.
- An explicit `kv_capacity` (tokens) is rounded up to whole pages, then checked (RD-11).
- Without one, the page count is solved from a device memory budget: the largest count in
  the CFG-6 range whose Main KV, backend KV, StateImage slots, workspace and compiled-step
  space fit the budget together with the weights (CFG-2, CFG-6). Where the budget comes from
  (the device's memory, a fraction of it, what is already in use) is the plan's.
- StateImage slots: C basic plus `device_state_slots` (default C) (CFG-4).
- Host arena: `host_capacity_bytes`, default 8 GiB + 8 × the Host StateImage size (CFG-5).
Errors are CapacityConfigError naming the bound and the numbers.
"""
from __future__ import annotations

from typing import NamedTuple

from ledger.errors import CapacityConfigError

PAGE_TOKENS = 64  # Main KV page size in tokens
GIB = 1 << 30
MAX_CONCURRENCY = 8  # CFG-3: C in 1..8
DEFAULT_HOST_BASE_BYTES = 8 * GIB  # CFG-5
HOST_STATE_IMAGES_IN_DEFAULT = 8  # CFG-5: default adds 8 Host StateImages


def _int(n, name: str, lo: int = 0) -> int:
    if not isinstance(n, int) or isinstance(n, bool):
        raise CapacityConfigError(f"{name} must be an int, got {type(n).__name__} {n!r}")
    if n < lo:
        raise CapacityConfigError(f"{name} must be >= {lo}, got {n}")
    return n


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_concurrency(max_concurrency: int) -> int:
    """CFG-3: C is fixed at start, 1..8."""
    _int(max_concurrency, "max_concurrency", 1)
    if max_concurrency > MAX_CONCURRENCY:
        raise CapacityConfigError(f"max_concurrency = {max_concurrency} exceeds the CFG-3 bound {MAX_CONCURRENCY}")
    return max_concurrency


def pages_for_tokens(tokens: int, page_tokens: int = PAGE_TOKENS) -> int:
    """Pages covering `tokens` tokens (rounded up, RD-11)."""
    return ceil_div(_int(tokens, "tokens"), _int(page_tokens, "page_tokens", 1))


def kv_page_range(max_context: int, max_concurrency: int) -> tuple[int, int]:
    """CFG-6: (max(ceil(max_context/64), C), C × ceil(max_context/64)) Main KV pages."""
    _int(max_context, "max_context", 1)
    c = check_concurrency(max_concurrency)
    per = pages_for_tokens(max_context)
    return max(per, c), c * per


def check_kv_pages(pages: int, max_context: int, max_concurrency: int) -> int:
    """Raise CapacityConfigError unless `pages` lies in the CFG-6 range."""
    _int(pages, "kv_capacity pages")
    lo, hi = kv_page_range(max_context, max_concurrency)
    per = pages_for_tokens(max_context)
    if pages < lo:
        raise CapacityConfigError(
            f"kv_capacity = {pages} pages ({pages * PAGE_TOKENS} tokens) is below the CFG-6 lower bound "
            f"max(ceil(max_context/64), C) = max({per}, {max_concurrency}) = {lo} pages "
            f"(max_context = {max_context}, C = {max_concurrency})")
    if pages > hi:
        raise CapacityConfigError(
            f"kv_capacity = {pages} pages ({pages * PAGE_TOKENS} tokens) is above the CFG-6 upper bound "
            f"C × ceil(max_context/64) = {max_concurrency} × {per} = {hi} pages "
            f"(max_context = {max_context}, C = {max_concurrency})")
    return pages


def state_slot_count(max_concurrency: int, device_state_slots: int | None = None) -> int:
    """CFG-4: C basic Device StateImage slots plus `device_state_slots` (default C)."""
    c = check_concurrency(max_concurrency)
    extra = c if device_state_slots is None else _int(device_state_slots, "device_state_slots")
    return c + extra


def default_host_capacity_bytes(host_state_image_bytes: int) -> int:
    """CFG-5: 8 GiB + 8 × the model's Host StateImage size."""
    return DEFAULT_HOST_BASE_BYTES + HOST_STATE_IMAGES_IN_DEFAULT * _int(host_state_image_bytes, "host StateImage bytes")


class DeviceBudget(NamedTuple):
    """What must share device memory with Main KV (CFG-6)."""

    budget_bytes: int  # device memory the engine may use for all of it
    main_page_bytes: int  # one 64-token Main KV page over all attention layers, K and V
    state_slot_bytes: int  # one Device StateImage
    state_slots: int  # C + device_state_slots
    workspace_bytes: int = 0
    compiled_step_bytes: int = 0
    backend_pools: tuple[tuple[int, int], ...] = ()  # (page_tokens, page_bytes) per backend KV pool
    weights_bytes: int = 0  # the model's parameters resident on the device (CFG-6: "fit device memory")


def backend_pages(main_pages: int, page_tokens: int) -> int:
    """Backend KV pages covering as many tokens as `main_pages` Main pages."""
    return ceil_div(main_pages * PAGE_TOKENS, page_tokens)


def fixed_bytes(b: DeviceBudget) -> int:
    """Device bytes that do not grow with the Main KV: weights, StateImage slots, workspace and
    compiled-step space (CFG-6)."""
    return b.weights_bytes + b.state_slots * b.state_slot_bytes + b.workspace_bytes + b.compiled_step_bytes


def device_bytes(b: DeviceBudget, main_pages: int) -> int:
    """Device bytes for `main_pages` Main KV pages and everything that comes with them."""
    backend = sum(backend_pages(main_pages, pt) * pb for pt, pb in b.backend_pools)
    return main_pages * b.main_page_bytes + backend + fixed_bytes(b)


def _check_budget(b: DeviceBudget) -> None:
    if not isinstance(b, DeviceBudget):
        raise CapacityConfigError(f"expected a DeviceBudget, got {type(b).__name__}")
    _int(b.budget_bytes, "device memory budget")
    _int(b.main_page_bytes, "main_page_bytes", 1)
    _int(b.state_slot_bytes, "state_slot_bytes")
    _int(b.state_slots, "state_slots")
    _int(b.workspace_bytes, "workspace_bytes")
    _int(b.compiled_step_bytes, "compiled_step_bytes")
    _int(b.weights_bytes, "weights_bytes")
    for pt, pb in b.backend_pools:
        _int(pt, "backend page_tokens", 1)
        _int(pb, "backend page_bytes", 1)


def _describe(b: DeviceBudget, pages: int) -> str:
    backend = sum(backend_pages(pages, pt) * pb for pt, pb in b.backend_pools)
    weights = f"weights {b.weights_bytes} B, " if b.weights_bytes else ""
    return (f"{weights}{pages} Main KV pages × {b.main_page_bytes} B = {pages * b.main_page_bytes} B, backend KV {backend} B, "
            f"{b.state_slots} StateImage slots × {b.state_slot_bytes} B = {b.state_slots * b.state_slot_bytes} B, "
            f"workspace {b.workspace_bytes} B, compiled steps {b.compiled_step_bytes} B: "
            f"total {device_bytes(b, pages)} B")


def check_device_fit(pages: int, budget: DeviceBudget) -> int:
    """CFG-6: an explicit capacity must fit device memory with everything else."""
    _check_budget(budget)
    need = device_bytes(budget, pages)
    if need > budget.budget_bytes:
        raise CapacityConfigError(f"device memory: {_describe(budget, pages)} exceeds the budget "
                                  f"{budget.budget_bytes} B by {need - budget.budget_bytes} B")
    return pages


def solve_kv_pages(budget: DeviceBudget, max_context: int, max_concurrency: int) -> int:
    """CFG-2: the largest Main KV page count in the CFG-6 range that fits the budget."""
    _check_budget(budget)
    lo, hi = kv_page_range(max_context, max_concurrency)
    if device_bytes(budget, lo) > budget.budget_bytes:
        raise CapacityConfigError(
            f"device memory budget {budget.budget_bytes} B cannot hold the CFG-6 lower bound of {lo} Main KV pages "
            f"(max_context = {max_context}, C = {max_concurrency}): {_describe(budget, lo)}, short by "
            f"{device_bytes(budget, lo) - budget.budget_bytes} B")
    while lo < hi:  # device_bytes is monotone in pages: binary search the largest fit
        mid = (lo + hi + 1) // 2
        if device_bytes(budget, mid) <= budget.budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def resolve_kv_pages(kv_capacity: int | None, max_context: int, max_concurrency: int,
                     budget: DeviceBudget | None = None) -> int:
    """Main KV pages from an explicit `kv_capacity` in tokens (rounded up to pages, RD-11,
    then CFG-6 range and device fit) or, when None, solved from the budget (CFG-2)."""
    if kv_capacity is None:
        if budget is None:
            raise CapacityConfigError("kv_capacity is None and no device memory budget was given to solve it (CFG-2)")
        return solve_kv_pages(budget, max_context, max_concurrency)
    pages = check_kv_pages(pages_for_tokens(_int(kv_capacity, "kv_capacity", 1)), max_context, max_concurrency)
    if budget is not None:
        check_device_fit(pages, budget)
    return pages
