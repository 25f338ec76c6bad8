"""Pool pytrees in the shapes the model uses (`ninfer_jax.model.pools.init_pools` builds the
same structure; any pytree with a leading unit axis works, so the model's own pools can be
wrapped directly: `UnitPool(MAIN_KV, KV_PAGES, kv, 64)`, `UnitPool(STATE_POOL, STATE_SLOTS, state)`).
"""
from __future__ import annotations

import jax.numpy as jnp

from ledger import KV_PAGES, MAIN_KV, PAGE_TOKENS, STATE_POOL, STATE_SLOTS
from ninfer_jax.program.unit_pool import UnitPool


def main_kv_pool(num_pages: int, num_attention_layers: int, kv_heads: int, head_dim: int,
                 dtype=jnp.float32, pool_id: str = MAIN_KV, page_tokens: int = PAGE_TOKENS) -> UnitPool:
    """Paged KV: {"k": per attention layer [num_pages, page_tokens, kv_heads, head_dim], "v": same}."""
    shape = (num_pages, page_tokens, kv_heads, head_dim)
    tree = {"k": tuple(jnp.zeros(shape, dtype) for _ in range(num_attention_layers)),
            "v": tuple(jnp.zeros(shape, dtype) for _ in range(num_attention_layers))}
    return UnitPool(pool_id, KV_PAGES, tree, page_tokens)


def state_image_pool(slots: int, num_gdn_layers: int, conv_kernel: int, conv_dim: int, num_v_heads: int,
                     head_k_dim: int, head_v_dim: int, hidden: int, dtype=jnp.float32,
                     pool_id: str = STATE_POOL) -> UnitPool:
    """StateImage slots: per GDN layer the conv state [slots, K-1, conv_dim] (model dtype) and
    the recurrent state [slots, H, Dk, Dv] (float32 whatever the model dtype), plus the
    continuation hidden [slots, hidden]. One slot index across all leaves is one StateImage."""
    tree = {"conv": tuple(jnp.zeros((slots, conv_kernel - 1, conv_dim), dtype) for _ in range(num_gdn_layers)),
            "recurrent": tuple(jnp.zeros((slots, num_v_heads, head_k_dim, head_v_dim), jnp.float32)
                               for _ in range(num_gdn_layers)),
            "hidden": jnp.zeros((slots, hidden), dtype)}
    return UnitPool(pool_id, STATE_SLOTS, tree)
