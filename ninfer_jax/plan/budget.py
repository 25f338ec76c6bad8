"""The device memory budget the pools are solved against (CFG-2).

    device     D = config.device_memory_bytes            ("a device with D bytes"; nothing in use)
               or  the device's memory_stats()["bytes_limit"], less what others already hold:
                   in_use = max(0, bytes_in_use - resident_bytes)   (resident_bytes: this engine's
                   own weights when they are loaded already, so they are not charged twice)
    usable     U = floor(D × device_memory_fraction) - in_use
    charged    weights + workspace + compiled steps + StateImage slots + backend KV + Main KV ≤ U

A device that reports no statistics (the CPU backend) has no D: the pools — Main KV, StateImage
slots, backend KV — get `DEFAULT_DEVICE_BUDGET` (1 GiB), and the weights, workspace and compiled
steps, which live in host memory there, are shown but not charged (the CFG-2 default).
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction

from ninfer_jax.config import EngineConfig
from ninfer_jax.errors import ConfigError
from ninfer_jax.plan.units import size

# CFG-2: a device that reports no memory statistics (the CPU backend) gives the pools — Main KV,
# StateImages, backend KV — this budget; weights, workspace and compiled steps are not charged.
DEFAULT_DEVICE_BUDGET = 1 << 30
SOURCES = ("device_memory_bytes", "memory_stats", "default")


@dataclasses.dataclass(frozen=True)
class Budget:
    """Where the device's memory came from and what of it the plan may fill."""

    source: str  # SOURCES
    device: str  # the device as its backend names it, or "" for device_memory_bytes
    device_bytes: int | None  # D (None: the default budget, no statistics)
    device_in_use_bytes: int | None  # bytes_in_use as reported (memory_stats only)
    in_use_charged_bytes: int  # what others hold, charged against the budget
    usable_bytes: int | None  # floor(D × fraction) - in use; None for the default
    budget_bytes: int  # what the ledger solves against: usable, or the default for the pools
    charged: bool  # False: the default budget, weights/workspace/compiled not charged


def usable_bytes(device_bytes: int, fraction: float) -> int:
    """floor(device_bytes × fraction), exact for the decimal the fraction was written as (CFG-2)."""
    return int(Fraction(device_bytes) * Fraction(repr(float(fraction))))


def device_budget(config: EngineConfig, *, weights_bytes: int, parameters: int, itemsize: int, device=None,
                  resident_bytes: int = 0) -> Budget:
    """The CFG-2 budget of `config`: from `device_memory_bytes`, else `device` (a `DeviceMemory`
    or a `jax.Device`; default: the first local device is asked). ConfigError naming
    `device_memory_bytes` when the weights alone exceed the usable memory."""
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
    if total is None:
        return Budget(source=source, device=name, device_bytes=None, device_in_use_bytes=in_use_reported,
                      in_use_charged_bytes=in_use, usable_bytes=None, budget_bytes=DEFAULT_DEVICE_BUDGET,
                      charged=False)
    usable = usable_bytes(total, config.device_memory_fraction) - in_use
    if weights_bytes > usable:
        short = f" less {in_use:,} B in use by others" if in_use else ""
        raise ConfigError("device_memory_bytes", (
            f"the weights alone need {weights_bytes:,} B ({size(weights_bytes)}: {parameters:,} parameters × "
            f"{itemsize} B) but the device budget is {max(usable, 0):,} B ({size(max(usable, 0))}) = "
            f"{config.device_memory_fraction:g} × {total:,} B ({size(total)}){short} (CFG-2, CFG-6): this model "
            f"needs a device with more memory (or a larger device_memory_fraction, at most 1)"))
    return Budget(source=source, device=name, device_bytes=total, device_in_use_bytes=in_use_reported,
                  in_use_charged_bytes=in_use, usable_bytes=usable, budget_bytes=max(0, usable), charged=True)
