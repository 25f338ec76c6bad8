"""`EngineConfig` and `ContextCacheConfig`: validation and the capacity they resolve to (CFG-*).

Capacity arithmetic is the ledger's (`ledger.capacity`); this module only gathers the model's
byte sizes and turns a config into concrete pool sizes, or a `ConfigError` naming the field
and the bound (CFG-6).
"""
from __future__ import annotations

import dataclasses
import functools

import ledger
from ninfer_jax.errors import ConfigError
from ninfer_jax.model.config import ModelConfig

BACKENDS = ("xla", "pallas", "interpret")
DTYPES = ("auto", "float32", "bfloat16")
PAUSE_ROUTES = ("auto", "snapshot", "replay")  # PAUSE-2: how a preempted request keeps its work
DEFAULT_DEVICE_BUDGET = 1 << 30  # bytes for KV + StateImages when kv_capacity is solved (CFG-2)


@dataclasses.dataclass(frozen=True)
class ContextCacheConfig:
    """CFG-4 `device_state_slots` (beyond the C basic ones; default C) and CFG-5
    `host_capacity_bytes` (default 8 GiB + 8 × the model's Host StateImage size)."""

    device_state_slots: int | None = None
    host_capacity_bytes: int | None = None
    enabled: bool = True  # False: no captures, no E, no reuse (the cold baseline)

    def __post_init__(self):
        if not isinstance(self.enabled, bool):
            raise ConfigError("context_cache.enabled", f"must be a bool, got {self.enabled!r}")
        if self.device_state_slots is not None and (
                not isinstance(self.device_state_slots, int) or not 0 <= self.device_state_slots <= 4096):
            raise ConfigError("context_cache.device_state_slots", f"must be an int in [0, 4096], got "
                                                                  f"{self.device_state_slots!r}")
        if self.host_capacity_bytes is not None and (
                not isinstance(self.host_capacity_bytes, int) or self.host_capacity_bytes < 0):
            raise ConfigError("context_cache.host_capacity_bytes",
                              f"must be a non-negative int, got {self.host_capacity_bytes!r}")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    model: str = "builtin:tiny-hybrid"
    # "auto": the checkpoint's own dtype (config.json, else its safetensors; float16 runs as
    # bfloat16); `resolved_dtype` is the one the model runs in.
    dtype: str = "auto"
    max_concurrency: int = 4  # C, lanes (CFG-3)
    max_context: int = 2048  # CFG-1: the logical context limit of one request
    kv_capacity: int | None = None  # Main KV tokens (CFG-2); None: solved from device_memory_bytes
    chunk_size: int = 64  # prefill tokens per cycle (SCH-1: one prefill chunk per cycle)
    context_cache: ContextCacheConfig = dataclasses.field(default_factory=ContextCacheConfig)
    backend: str = "xla"  # kernels: xla | pallas | interpret
    device_memory_bytes: int | None = None  # budget for the CFG-2 solve (default 1 GiB)
    max_queue: int = 4096  # waiting requests beyond this are refused (QueueFullError)
    progress: bool = True  # warm-up progress lines on stderr
    # PAUSE-2: Snapshot (copy the unique content to Host, read it back on resume) or Replay
    # (recompute what was computed); "auto" lets the cost model compare copy vs recompute.
    pause_route: str = "auto"

    def __post_init__(self):
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError("model", f"must be a folder or builtin:tiny-hybrid, got {self.model!r}")
        if self.dtype not in DTYPES:
            raise ConfigError("dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.max_concurrency, int) or not 1 <= self.max_concurrency <= 8:
            raise ConfigError("max_concurrency", f"C must be an int in [1, 8] (CFG-3), got {self.max_concurrency!r}")
        if not isinstance(self.max_context, int) or self.max_context < 2:
            raise ConfigError("max_context", f"must be an int >= 2, got {self.max_context!r}")
        if not isinstance(self.chunk_size, int) or not 1 <= self.chunk_size <= 4096:
            raise ConfigError("chunk_size", f"must be an int in [1, 4096], got {self.chunk_size!r}")
        if self.kv_capacity is not None and (not isinstance(self.kv_capacity, int) or self.kv_capacity < 1):
            raise ConfigError("kv_capacity", f"must be a positive number of tokens, got {self.kv_capacity!r}")
        if self.backend not in BACKENDS:
            raise ConfigError("backend", f"must be one of {BACKENDS}, got {self.backend!r}")
        if not isinstance(self.max_queue, int) or self.max_queue < 1:
            raise ConfigError("max_queue", f"must be a positive int, got {self.max_queue!r}")
        if self.pause_route not in PAUSE_ROUTES:
            raise ConfigError("pause_route", f"must be one of {PAUSE_ROUTES}, got {self.pause_route!r}")
        if not isinstance(self.context_cache, ContextCacheConfig):
            raise ConfigError("context_cache", "must be a ContextCacheConfig")

    @functools.cached_property
    def resolved_dtype(self) -> str:
        """The dtype the model runs in: `dtype`, or for "auto" the checkpoint's own (read from
        its config.json or safetensors headers once; a ConfigError if the model is unknown)."""
        from ninfer_jax.model.model import resolve_dtype

        return resolve_dtype(self.model, self.dtype)


@dataclasses.dataclass(frozen=True)
class Capacity:
    """Concrete pool sizes a config resolves to for one model."""

    kv_pages: int  # Main KV pages (CFG-2, CFG-6)
    state_slots: int  # C basic + device_state_slots (CFG-4)
    host_capacity_bytes: int  # the Host arena (CFG-5)
    pages_per_request: int  # ceil(max_context / 64): a request's page-table width


def resolve_capacity(config: EngineConfig, model: ModelConfig, itemsize: int) -> Capacity:
    """Pool sizes for `config` on `model`, or a ConfigError naming the violated bound."""
    c = config.max_concurrency
    slots = ledger.state_slot_count(c, config.context_cache.device_state_slots)
    page_bytes = model.kv_bytes_per_token(itemsize) * ledger.PAGE_TOKENS
    state_bytes = model.state_image_bytes(itemsize)
    budget = ledger.DeviceBudget(
        budget_bytes=config.device_memory_bytes if config.device_memory_bytes is not None else DEFAULT_DEVICE_BUDGET,
        main_page_bytes=max(page_bytes, 1), state_slot_bytes=state_bytes, state_slots=slots)
    try:
        pages = ledger.resolve_kv_pages(config.kv_capacity, config.max_context, c,
                                        budget if config.kv_capacity is None or config.device_memory_bytes else None)
    except ledger.CapacityConfigError as e:
        raise ConfigError("kv_capacity", str(e)) from None
    host = config.context_cache.host_capacity_bytes
    if host is None:
        host = ledger.default_host_capacity_bytes(state_bytes)
    return Capacity(kv_pages=pages, state_slots=slots, host_capacity_bytes=host,
                    pages_per_request=ledger.pages_for_tokens(config.max_context))
