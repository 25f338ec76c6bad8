"""The capacity plan: what a config puts on the device, and the pools it leaves room for (CFG-2..6).

A config and the model's geometry (a `ModelConfig` and the bytes per element) go in once;
one `CapacityPlan` comes out: the budget, the weights, the workspace and compiled-code
allowance of the steps, the pools (Main KV, StateImage slots, backend KV, the Host arena),
the split of the pool bytes between StateImages and Main KV, and the reason for each figure.
The Program, the cost-model Program, `ninfer plan`, `ninfer lower` and `ninfer trace` read that
value; none of them recomputes a part of it.

- `capacity_plan.py`: `plan_capacity`, the one pass, and the `CapacityPlan` it returns;
- `budget.py`: the device's memory and what of it the plan may fill (CFG-2);
- `workspace.py`: the steps the Program compiles, their workspace and compiled-code allowance;
- `pools.py`: `Capacity` (the pool sizes the Program builds) and the backend KV pools (RES-1);
- `split.py`: one cache byte budget split between the pools (`--cache_device_bytes`, `--split`);
- `report.py`: the plan as `ninfer plan` prints it; `units.py`: byte counts as people read them.

Main KV gets the largest page count in the CFG-6 range that fits (`ledger/capacity.py` holds
the rules); the plan forms the budget they are solved against. It reads the model's geometry
only, never its weights.
"""
from ninfer_jax.plan.budget import DEFAULT_DEVICE_BUDGET, SOURCES, Budget, device_budget, usable_bytes
from ninfer_jax.plan.capacity_plan import (CacheBytes, CapacityPlan, plan_capacity, resolve_capacity, with_cache_bytes,
                                          with_reach)
from ninfer_jax.plan.pools import Capacity, speculative_pools
from ninfer_jax.plan.split import (DEFAULT_SPLIT_CONTEXT_SHARE, DEFAULT_SPLIT_RULE, MAX_EXTRA_STATE_SLOTS, CacheSplit,
                                   check_cache_device_bytes, check_split, default_split, split_cache_bytes)
from ninfer_jax.plan.units import size
from ninfer_jax.plan.workspace import (COMPILED_OTHER_BYTES, COMPILED_STEP_BASE_BYTES, COMPILED_STEP_LAYER_BYTES,
                                      DECODE_BUCKETS, MIB, Workspace, compiled_program_bytes, compiled_step_bytes,
                                      compiled_step_programs, decode_buckets, step_workspace_bytes, token_width,
                                      workspace)

__all__ = [
    "COMPILED_OTHER_BYTES", "COMPILED_STEP_BASE_BYTES", "COMPILED_STEP_LAYER_BYTES", "DECODE_BUCKETS",
    "DEFAULT_DEVICE_BUDGET", "DEFAULT_SPLIT_CONTEXT_SHARE", "DEFAULT_SPLIT_RULE", "MAX_EXTRA_STATE_SLOTS", "MIB",
    "SOURCES", "Budget", "CacheBytes", "CacheSplit", "Capacity", "CapacityPlan", "Workspace",
    "check_cache_device_bytes", "check_split", "compiled_program_bytes", "compiled_step_bytes",
    "compiled_step_programs", "decode_buckets", "default_split", "device_budget", "plan_capacity",
    "resolve_capacity", "size", "speculative_pools", "split_cache_bytes", "step_workspace_bytes", "token_width",
    "usable_bytes", "with_cache_bytes", "with_reach", "workspace",
]
