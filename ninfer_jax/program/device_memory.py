"""What the accelerator says about its memory, for the CFG-2 capacity solve (ninfer_jax/plan/budget.py).

`query()` reads `device.memory_stats()` of the first local JAX device. Backends that keep such
statistics (GPU, TPU) report `bytes_limit` — what JAX's allocator may hand out on this device
(on a GPU with JAX's default preallocation that is `XLA_PYTHON_CLIENT_MEM_FRACTION`, 75 %, of
the card) — and `bytes_in_use`, what live buffers hold right now. The CPU backend keeps none
(`memory_stats()` is None): the plan then falls back to its documented default budget.

Only statistics are read: nothing is allocated, and a backend that raises on the call counts
as one without statistics.
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """One device's memory as its backend reports it."""

    device: str  # the device as JAX names it, e.g. "cuda:0", "TFRT_CPU_0"
    platform: str  # "gpu", "tpu", "cpu", ...
    kind: str  # device_kind, e.g. "NVIDIA H200"
    bytes_limit: int | None  # memory_stats()["bytes_limit"]; None: the backend keeps no statistics
    bytes_in_use: int  # memory_stats()["bytes_in_use"]; 0 without statistics

    @property
    def has_stats(self) -> bool:
        return self.bytes_limit is not None


def _stat(stats: dict, key: str) -> int | None:
    value = stats.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def describe(device: Any) -> DeviceMemory:
    """The memory of `device` (a `jax.Device`, or anything with `memory_stats()`, `platform` and
    `device_kind`)."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 — a backend without statistics may raise anything here
        stats = None
    limit = _stat(stats, "bytes_limit") if isinstance(stats, dict) else None
    in_use = (_stat(stats, "bytes_in_use") or 0) if limit is not None else 0
    return DeviceMemory(device=str(device), platform=str(getattr(device, "platform", "?")),
                        kind=str(getattr(device, "device_kind", "?")), bytes_limit=limit, bytes_in_use=in_use)


def query(device: Any | None = None) -> DeviceMemory:
    """The memory of `device`, default the first local JAX device (the one the engine runs on, G-1)."""
    if device is None:
        import jax

        device = jax.local_devices()[0]
    return describe(device)
