"""One cache byte budget shared by the pools (`ninfer trace --cache_device_bytes=N [--split=S]`,
`ninfer plan --cache_device_bytes=N`).

Instead of solving against the device's memory, N bytes are shared by the StateImage slots, the
Main KV pages and the backend pools that grow with them (weights, workspace and compiled steps
are not charged: "what if the cache had N bytes"):

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
from typing import Any

from ledger import capacity as cap
from ninfer_jax.errors import ConfigError
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.plan.pools import Capacity, backend_pool_bytes
from ninfer_jax.plan.units import size

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
        return p * page_bytes + backend_pool_bytes(p, backend_pools)

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
    backend = backend_pool_bytes(pages, backend_pools)
    return CacheSplit(cache_device_bytes=n, split=split, split_source=split_source or "--split", max_concurrency=c,
                      state_slots=slots, state_slot_bytes=slot, kv_pages=pages, kv_page_bytes=page,
                      backend_pools=backend_pools, backend_pool_bytes=backend, max_context=mc,
                      max_context_source=how, longest_request=longest_request, limited_by=limited_by)
