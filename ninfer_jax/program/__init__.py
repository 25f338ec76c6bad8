"""The Program's stores: device pools as JAX arrays, the Host arena buffer, commit(plan).

The engine's `Program` (a later issue) owns a `ProgramStores` and its compiled steps.
"""
from ninfer_jax.program.host_arena import HostArenaBuffer
from ninfer_jax.program.layouts import main_kv_pool, state_image_pool
from ninfer_jax.program.stores import ProgramStores
from ninfer_jax.program.unit_pool import UnitPool

__all__ = ["HostArenaBuffer", "ProgramStores", "UnitPool", "main_kv_pool", "state_image_pool"]
