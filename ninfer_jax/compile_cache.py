"""JAX's persistent compilation cache for every `ninfer` command, and a compilation counter.

    from ninfer_jax.compile_cache import enable
    enable(None)        # $NINFER_COMPILATION_CACHE, else $XDG_CACHE_HOME/ninfer/jax (~/.cache/ninfer/jax)
    enable("/fast/disk/ninfer-jax")   # another folder
    enable("off")       # no persistent cache (also NINFER_COMPILATION_CACHE=off)

Call it before any JAX work: the step functions of a model compile to the same executables in
every process, so a second run with the same model, dtype, backend and shapes reads them back
instead of compiling. Every executable is written, however small or quick to compile (JAX's
defaults skip those under one second, which is all of the built-in model's on CPU).

`CompileCounter` counts, from JAX's monitoring events, the XLA compilations a process asked
for and how many of them the persistent cache answered; the rest really compiled.
"""
from __future__ import annotations

import os

import jax

from ninfer_jax.errors import ConfigError

ENV = "NINFER_COMPILATION_CACHE"
OFF = "off"

# JAX's monitoring events (jax/_src/dispatch.py, jax/_src/compiler.py). The backend-compile
# duration is recorded around every XLA compilation request, cache hit or not.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_REQUEST_EVENT = "/jax/compilation_cache/compile_requests_use_cache"


def default_folder() -> str:
    """The user cache folder: `$XDG_CACHE_HOME/ninfer/jax`, or `~/.cache/ninfer/jax`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ninfer", "jax")


def resolve(path: str | None) -> str | None:
    """The folder `enable(path)` uses: None for off; `path` None means the environment's choice."""
    value = path if path is not None else os.environ.get(ENV)
    if value is None or not value.strip():
        return default_folder()
    if value.strip().lower() == OFF:
        return None
    return os.path.abspath(os.path.expanduser(value.strip()))


def enable(path: str | None = None) -> str | None:
    """Turn JAX's persistent compilation cache on in the resolved folder (created if needed)
    and return it; `off` turns it off and returns None. Calling it again with the same answer
    changes nothing. A folder that cannot be created or written is a ConfigError."""
    folder = resolve(path)
    if folder is None:
        _use_folder(None)
        return None
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ConfigError("compilation_cache", f"cannot create the folder {folder!r}: {e.strerror or e}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError("compilation_cache", f"the folder {folder!r} is not writable")
    # Cache every executable: no compile-time floor (default 1 s) and no entry-size floor
    # (-1: no size restriction, and JAX does not override it).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    _use_folder(folder)
    return folder


def _use_folder(folder: str | None) -> None:
    if jax.config.jax_compilation_cache_dir == folder:
        return
    jax.config.update("jax_compilation_cache_dir", folder)
    # JAX opens its cache once per process, at the first compilation: forget an earlier one so
    # the new folder (or none) takes effect even when something compiled already.
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()


class CompileCounter:
    """Counts this process's XLA compilation requests while started (or inside `with`).

    `requests`: every backend compilation JAX asked for; `cache_hits`: those the persistent
    cache answered; `compiled`: the ones that really compiled (requests − hits).
    """

    def __init__(self):
        self.requests = 0
        self.cache_hits = 0
        self.cache_lookups = 0
        self._started = False

    @property
    def compiled(self) -> int:
        return self.requests - self.cache_hits

    def _on_event(self, event: str, **_) -> None:
        if event == CACHE_HIT_EVENT:
            self.cache_hits += 1
        elif event == CACHE_REQUEST_EVENT:
            self.cache_lookups += 1

    def _on_duration(self, event: str, _seconds: float, **_) -> None:
        if event == BACKEND_COMPILE_EVENT:
            self.requests += 1

    def start(self) -> "CompileCounter":
        if not self._started:
            jax.monitoring.register_event_listener(self._on_event)
            jax.monitoring.register_event_duration_secs_listener(self._on_duration)
            self._started = True
        return self

    def stop(self) -> None:
        if self._started:
            jax.monitoring.unregister_event_listener(self._on_event)
            jax.monitoring.unregister_event_duration_listener(self._on_duration)
            self._started = False

    def __enter__(self) -> "CompileCounter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def as_dict(self) -> dict:
        return {"requests": self.requests, "cache_hits": self.cache_hits,
                "cache_lookups": self.cache_lookups, "compiled": self.compiled}


def compile_counted(lowered) -> tuple[object, bool]:
    """`lowered.compile()`, and whether JAX's persistent cache answered it (a cache hit, nothing
    compiled) — read from JAX's own cache events around the call, so progress lines and the
    engine's counters can tell a read-back from a compilation."""
    with CompileCounter() as counter:
        exe = lowered.compile()
    return exe, counter.cache_hits > 0 and counter.compiled == 0


def summary(compiled: int, from_cache: int) -> str:
    """`12 compiled, 53 from cache` (the progress line's and `ninfer generate`'s wording)."""
    return f"{compiled} compiled, {from_cache} from cache"
