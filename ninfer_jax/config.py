"""`EngineConfig` and `ContextCacheConfig`: what an engine is asked to be, validated field by field (CFG-*).

A config holds values only. What they come to on a model — the device budget, the workspace,
the pool sizes, or a `ConfigError` naming the field and the bound (CFG-2, CFG-6) — is the
capacity plan's (`ninfer_jax/plan/`), whose capacity arithmetic is the ledger's (`ledger.capacity`).
"""
from __future__ import annotations

import dataclasses
import functools
import math

from ninfer_jax.errors import ConfigError

BACKENDS = ("xla", "pallas", "interpret")
DTYPES = ("auto", "float32", "bfloat16")
SPECULATIVE_METHODS = ("mtp", "dflash")  # issue 35; dflash2 is refused as not built
MAX_DFLASH_TOKENS = 15  # k with a DFlash drafter; its own block_size - 1 bounds it too (plan/pools.py)
PAUSE_ROUTES = ("auto", "snapshot", "replay")  # PAUSE-2: how a preempted request keeps its work
DEFAULT_DEVICE_MEMORY_FRACTION = 0.9  # CFG-2: the share of the device's memory the engine plans with


def _refuse_bools(config, prefix: str = "") -> None:
    """A Python bool is an int (True == 1): a field declared `int` or `int | None` given True or
    False is refused with a ConfigError naming it, not read as 1 or 0."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.type in ("int", "int | None", int, int | None) and isinstance(value, bool):
            raise ConfigError(prefix + f.name, f"must be an int, got the bool {value!r}")


@dataclasses.dataclass(frozen=True)
class ContextCacheConfig:
    """CFG-4 `device_state_slots` (beyond the C basic ones; default C) and CFG-5
    `host_capacity_bytes` (default 8 GiB + 8 × the model's Host StateImage size)."""

    device_state_slots: int | None = None
    host_capacity_bytes: int | None = None
    enabled: bool = True  # False: no captures, no E, no reuse (the cold baseline)
    # Raw prompts get one automatic shared save point where they leave every recently seen
    # prompt (engine/branch_points.py, a reading of SH-6).
    branch_points: bool = True

    def __post_init__(self):
        _refuse_bools(self, "context_cache.")
        if not isinstance(self.enabled, bool):
            raise ConfigError("context_cache.enabled", f"must be a bool, got {self.enabled!r}")
        if not isinstance(self.branch_points, bool):
            raise ConfigError("context_cache.branch_points", f"must be a bool, got {self.branch_points!r}")
        if self.device_state_slots is not None and (
                not isinstance(self.device_state_slots, int) or not 0 <= self.device_state_slots <= 4096):
            raise ConfigError("context_cache.device_state_slots", f"must be an int in [0, 4096], got "
                                                                  f"{self.device_state_slots!r}")
        if self.host_capacity_bytes is not None and (
                not isinstance(self.host_capacity_bytes, int) or self.host_capacity_bytes < 0):
            raise ConfigError("context_cache.host_capacity_bytes",
                              f"must be a non-negative int, got {self.host_capacity_bytes!r}")


DEFAULT_MEDIA_CACHE_BYTES = 256 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class MediaConfig:
    """Image and video input (issue 34): where media may come from, its limits, and the byte
    budget of the engine's media cache (the tower's outputs, apart from the Host context
    capacity; engine/media_cache.py). None limits: the frontend's defaults (frontend/media.py)."""

    cache_bytes: int = DEFAULT_MEDIA_CACHE_BYTES
    allowed_local_media_path: str | None = None  # file:// URLs only under this folder
    allow_remote_urls: bool = False  # fetch http(s) URLs (size-capped, with a timeout); else refused
    max_input_pixels: int | None = None  # per image or video frame, read from its header
    max_input_frames: int | None = None  # per video (None: the video processor's max_frames)

    def __post_init__(self):
        _refuse_bools(self, "media.")
        if not isinstance(self.cache_bytes, int) or self.cache_bytes < 0:
            raise ConfigError("media.cache_bytes", f"must be a non-negative number of bytes, got {self.cache_bytes!r}")
        for name in ("max_input_pixels", "max_input_frames"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ConfigError("media." + name, f"must be a positive int, got {v!r}")
        if not isinstance(self.allow_remote_urls, bool):
            raise ConfigError("media.allow_remote_urls", f"must be a bool, got {self.allow_remote_urls!r}")
        p = self.allowed_local_media_path
        if p is not None and (not isinstance(p, str) or not p):
            raise ConfigError("media.allowed_local_media_path", f"must be a folder path, got {p!r}")

    def policy(self, enabled: bool = True, why: str = ""):
        """The frontend's `MediaPolicy` of these settings."""
        from ninfer_jax.frontend.media_sources import MediaPolicy

        limits = {k: getattr(self, k) for k in ("max_input_pixels",) if getattr(self, k) is not None}
        return MediaPolicy(allowed_local_media_path=self.allowed_local_media_path,
                           allow_remote_urls=self.allow_remote_urls, max_input_frames=self.max_input_frames,
                           enabled=enabled, why=why, **limits)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    model: str = "builtin:tiny-hybrid"
    # "auto": the checkpoint's own dtype (config.json, else its safetensors; float16 runs as
    # bfloat16); `resolved_dtype` is the one the model runs in.
    dtype: str = "auto"
    max_concurrency: int = 4  # C, lanes (CFG-3)
    max_context: int = 2048  # CFG-1: the logical context limit of one request
    kv_capacity: int | None = None  # Main KV tokens (CFG-2); None: solved from the device's memory
    chunk_size: int = 64  # prefill tokens per cycle (SCH-1: one prefill chunk per cycle)
    context_cache: ContextCacheConfig = dataclasses.field(default_factory=ContextCacheConfig)
    backend: str = "xla"  # kernels: xla | pallas | interpret
    # CFG-2: the device's memory in bytes, instead of asking the device (memory_stats' bytes_limit);
    # None: ask it (a device with no statistics, the CPU, gets DEFAULT_DEVICE_BUDGET for its pools).
    device_memory_bytes: int | None = None
    # CFG-2: the share of that memory the plan may fill (weights, pools, workspace, compiled
    # steps); the rest is headroom for what the plan does not model. Applies to both sources.
    device_memory_fraction: float = DEFAULT_DEVICE_MEMORY_FRACTION
    max_queue: int = 4096  # waiting requests beyond this are refused (QueueFullError)
    progress: bool = True  # warm-up progress lines on stderr
    # PAUSE-2: Snapshot (copy the unique content to Host, read it back on resume) or Replay
    # (recompute what was computed); "auto" lets the cost model compare copy vs recompute.
    pause_route: str = "auto"
    # Speculative decoding (issue 17): k drafts per decode row, verified by the main model in one
    # step (0: off; 1..4 with the checkpoint's MTP head, which needs mtp_num_hidden_layers > 0).
    speculative_tokens: int = 0
    # the drafts' source (issue 35): "mtp", the model's own MTP head; "dflash", the DFlash drafter
    # in `draft_model` (a folder as published; None with the built-in model: its shipped drafter,
    # model/builtin.DRAFTER_NAME), k up to its block_size - 1
    speculative_method: str = "mtp"
    draft_model: str | None = None
    media: MediaConfig = dataclasses.field(default_factory=MediaConfig)  # image and video input
    # A jinja file whose text replaces the tokenizer's chat template (chat, the HTTP routes, gRPC
    # Chat); read and compiled before any weight loads (engine/intake.py read_chat_template).
    chat_template: str | None = None

    def __post_init__(self):
        _refuse_bools(self)
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
        if self.device_memory_bytes is not None and (
                not isinstance(self.device_memory_bytes, int) or isinstance(self.device_memory_bytes, bool)
                or self.device_memory_bytes < 1):
            raise ConfigError("device_memory_bytes", f"must be a positive number of bytes, got "
                                                     f"{self.device_memory_bytes!r}")
        f = self.device_memory_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 < f <= 1:
            raise ConfigError("device_memory_fraction", f"must be a number in (0, 1], got {f!r}")
        if self.backend not in BACKENDS:
            raise ConfigError("backend", f"must be one of {BACKENDS}, got {self.backend!r}")
        if not isinstance(self.max_queue, int) or self.max_queue < 1:
            raise ConfigError("max_queue", f"must be a positive int, got {self.max_queue!r}")
        if self.pause_route not in PAUSE_ROUTES:
            raise ConfigError("pause_route", f"must be one of {PAUSE_ROUTES}, got {self.pause_route!r}")
        if self.speculative_method not in SPECULATIVE_METHODS:
            if self.speculative_method == "dflash2":
                raise ConfigError("speculative_method", "dflash2 is not built yet; use mtp or dflash")
            raise ConfigError("speculative_method", f"must be one of {SPECULATIVE_METHODS}, got "
                                                    f"{self.speculative_method!r}")
        k, most = self.speculative_tokens, 4 if self.speculative_method == "mtp" else MAX_DFLASH_TOKENS
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= most:
            raise ConfigError("speculative_tokens", f"must be an int in [0, {most}] (0: off) with "
                                                    f"speculative_method={self.speculative_method}, got {k!r}")
        if self.speculative_method == "dflash":
            from ninfer_jax.model import builtin  # its names only: no JAX

            if self.draft_model is None and self.model == builtin.NAME:  # its shipped drafter, the demo
                object.__setattr__(self, "draft_model", builtin.DRAFTER_NAME)
            if not isinstance(self.draft_model, str) or not self.draft_model:
                raise ConfigError("draft_model", "speculative_method=dflash needs the drafter's folder (only the "
                                                 f"built-in model has one by default, {builtin.DRAFTER_NAME})")
        elif self.draft_model is not None:
            raise ConfigError("draft_model", f"a drafter folder goes with speculative_method=dflash, not "
                                             f"{self.speculative_method}")
        if not isinstance(self.context_cache, ContextCacheConfig):
            raise ConfigError("context_cache", "must be a ContextCacheConfig")
        if not isinstance(self.media, MediaConfig):
            raise ConfigError("media", "must be a MediaConfig")
        if self.chat_template is not None and (not isinstance(self.chat_template, str) or not self.chat_template):
            raise ConfigError("chat_template", f"must be a file path, got {self.chat_template!r}")

    @functools.cached_property
    def resolved_dtype(self) -> str:
        """The dtype the model runs in: `dtype`, or for "auto" the checkpoint's own (read from
        its config.json or safetensors headers once; a ConfigError if the model is unknown)."""
        from ninfer_jax.model.model import resolve_dtype

        return resolve_dtype(self.model, self.dtype)
