"""`ninfer lower`'s abstract model and pools: the parameters and pools of the Program a config
plans, as `jax.ShapeDtypeStruct`s (lower.py lowers every step over them; nothing is allocated,
no tensor read)."""
from __future__ import annotations

import functools
from typing import Any


class Abstract:
    """The model, its parameters and the pools as ShapeDtypeStructs (built once, on first use)."""

    def __init__(self, plan: Any):  # lower.LowerPlan
        self.plan = plan
        self.shapes = plan.shapes
        self.cfg = plan.shapes.cfg
        self.backend = plan.backend

    @functools.cached_property
    def dtype(self):
        from ninfer_jax.model.model import DTYPES

        return DTYPES[self.shapes.dtype]

    def _zeros(self, shapes):
        import jax
        import jax.numpy as jnp

        from ninfer_jax.model.weights import is_shape

        return jax.tree.map(lambda s: jnp.zeros(s, self.dtype), shapes, is_leaf=is_shape)

    def _split(self, with_mtp: bool):
        from flax import nnx

        from ninfer_jax.model.modules import HybridLM, split
        from ninfer_jax.model.weights import mtp_shapes, param_shapes

        def build():  # traced by nnx.eval_shape: the zeros are never allocated
            mtp = self._zeros(mtp_shapes(self.cfg)) if with_mtp else None
            return HybridLM(self.cfg, self._zeros(param_shapes(self.cfg)), mtp)

        return split(nnx.eval_shape(build))

    @functools.cached_property
    def model(self):
        """(merger, leaves) of HybridLM(cfg, params), as `Model.functional`."""
        return self._split(with_mtp=False)

    @functools.cached_property
    def spec_model(self):
        """(merger, leaves) of HybridLM(cfg, params, mtp), as `MTPSteps`; with a DFlash drafter,
        (merger, (leaves, drafter params)) of the plain model, as `CompiledSteps.enable_speculative`."""
        if self.shapes.drafter is None:
            return self._split(with_mtp=True)
        import jax

        from ninfer_jax.model import dflash
        from ninfer_jax.model.weights import is_shape

        merger, leaves = self.model
        drafter = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, self.dtype),
                               dflash.param_shapes(self.shapes.drafter), is_leaf=is_shape)
        return merger, (leaves, drafter)

    @functools.cached_property
    def params(self) -> dict:
        """The loader's params dict (what `lm_head` takes)."""
        import jax

        from ninfer_jax.model.weights import is_shape, param_shapes

        return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, self.dtype), param_shapes(self.cfg), is_leaf=is_shape)

    @functools.cached_property
    def pools(self):
        """(kv, state) of `init_pools` at the planned capacity."""
        import jax

        from ninfer_jax.model.pools import init_pools

        s = self.shapes
        return jax.eval_shape(lambda: init_pools(self.cfg, s.kv_pages, s.state_slots, self.dtype, self.backend))

    @functools.cached_property
    def spec_pool(self):
        """The speculative steps' pool: the MTP layers' K/V, or the DFlash drafter's context K/V."""
        import jax

        from ninfer_jax.model.dflash_steps import init_dflash_pool
        from ninfer_jax.model.mtp_steps import init_mtp_pool

        s = self.shapes
        if s.drafter is not None:
            return jax.eval_shape(lambda: init_dflash_pool(s.drafter, s.mtp_pages, self.dtype, self.backend))
        return jax.eval_shape(lambda: init_mtp_pool(self.cfg, s.mtp_pages, self.dtype, backend=self.backend))

    def pool(self, pool_id: str):
        """A pool's pytree by its ledger id (Main KV, StateImage slots, the speculative pool)."""
        from ledger import MAIN_KV, STATE_POOL

        if pool_id == MAIN_KV:
            return self.pools[0]
        return self.pools[1] if pool_id == STATE_POOL else self.spec_pool


def spec_pool_id(shapes: Any) -> str:  # lower.Shapes
    """The ledger id of the speculative steps' pool."""
    from ninfer_jax.model.dflash_steps import DFLASH_POOL
    from ninfer_jax.model.spec_steps import MTP_POOL

    return MTP_POOL if shapes.drafter is None else DFLASH_POOL



def i32(*shape):
    import jax
    import jax.numpy as jnp

    return jax.ShapeDtypeStruct(shape, jnp.int32)


def sds(shape, dtype):
    import jax

    return jax.ShapeDtypeStruct(tuple(shape), dtype)
