"""A device pool: a pytree of JAX arrays that share a leading unit axis (pages or slots).

Main KV is one such pool (per attention layer, K and V `[num_pages, 64, kv_heads, head_dim]`),
StateImage slots another (per GDN layer conv `[slots, K-1, conv_dim]` and recurrent
`[slots, H, Dk, Dv]` float32, plus the continuation hidden `[slots, hidden]`). The pool does
not care what the leaves are: the model defines its exact pytree, the ledger sees a unit of
`unit_bytes` bytes. One unit's bytes are its leaves' unit slices in tree-flatten order; that
is the layout of its Host replica.

Only the Program calls these methods; the ledger has already checked every index.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ledger import KV_PAGES, STATE_SLOTS, PoolSpec


def _bucket(k: int) -> int:
    """Pad index vectors to a power of two so few shapes compile."""
    return 1 << max(0, (k - 1).bit_length())


@jax.jit
def _gather(leaves, idx):  # leaves: list of [units, ...]; idx: [k]
    return [jnp.take(leaf, idx, axis=0) for leaf in leaves]


@functools.partial(jax.jit, donate_argnums=(0,))
def _scatter(leaves, idx, values):  # values: list of [k, ...]
    return [leaf.at[idx].set(val) for leaf, val in zip(leaves, values)]


@functools.partial(jax.jit, donate_argnums=(0,))
def _copy(leaves, src, dst):  # src, dst: [k]
    return [leaf.at[dst].set(jnp.take(leaf, src, axis=0)) for leaf in leaves]


class UnitPool:
    def __init__(self, pool_id: str, kind: str, tree: Any, page_tokens: int = 0):
        if kind not in (KV_PAGES, STATE_SLOTS):
            raise ValueError(f"pool kind {kind!r} not in {(KV_PAGES, STATE_SLOTS)}")
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        if not leaves:
            raise ValueError(f"pool {pool_id!r}: empty pytree")
        leaves = [jnp.asarray(leaf) for leaf in leaves]
        units = {leaf.shape[0] if leaf.ndim else None for leaf in leaves}
        if len(units) != 1 or None in units:
            raise ValueError(f"pool {pool_id!r}: leaves must share a leading unit axis, got {[l.shape for l in leaves]}")
        self.pool_id = pool_id
        self.kind = kind
        self.page_tokens = page_tokens
        self.capacity = units.pop()
        self._treedef = treedef
        self._leaves = list(leaves)
        self._shapes = [(l.shape, l.dtype) for l in leaves]
        self._leaf_bytes = [math.prod(l.shape[1:]) * np.dtype(l.dtype).itemsize for l in leaves]
        self._bounds = np.cumsum([0] + self._leaf_bytes).tolist()
        self.unit_bytes = self._bounds[-1]

    # -- the arrays ---------------------------------------------------------------------
    @property
    def tree(self) -> Any:
        return jax.tree_util.tree_unflatten(self._treedef, self._leaves)

    def replace(self, tree: Any) -> None:
        """Install the pool returned by a step that donated it; same structure, shapes, dtypes."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        if treedef != self._treedef or [(l.shape, l.dtype) for l in leaves] != self._shapes:
            raise ValueError(f"pool {self.pool_id!r}: replacement tree differs in structure, shape or dtype")
        self._leaves = list(leaves)

    def spec(self) -> PoolSpec:
        return PoolSpec(self.pool_id, self.kind, self.capacity, self.unit_bytes, self.page_tokens)

    # -- byte movement --------------------------------------------------------------------
    def _idx(self, units: Sequence[int]) -> jnp.ndarray:
        units = list(units)
        pad = _bucket(len(units)) - len(units)
        return jnp.asarray(units + [units[-1]] * pad, dtype=jnp.int32)

    def read_units(self, units: Sequence[int]) -> np.ndarray:
        """Bytes of the given units: uint8 [k, unit_bytes]."""
        k = len(units)
        parts = _gather(self._leaves, self._idx(units))
        return np.concatenate([np.asarray(p)[:k].reshape(k, -1).view(np.uint8) for p in parts], axis=1)

    def write_units(self, units: Sequence[int], data: np.ndarray) -> None:
        """Set the given units from bytes uint8 [k, unit_bytes]."""
        k = len(units)
        data = np.asarray(data, dtype=np.uint8).reshape(k, self.unit_bytes)
        pad = _bucket(k) - k
        if pad:
            data = np.concatenate([data, np.repeat(data[-1:], pad, axis=0)])
        values = []
        for (shape, dtype), a, b in zip(self._shapes, self._bounds, self._bounds[1:]):
            chunk = np.ascontiguousarray(data[:, a:b]).view(np.dtype(dtype)).reshape((k + pad,) + shape[1:])
            values.append(jnp.asarray(chunk))
        self._leaves = _scatter(self._leaves, self._idx(units), values)

    def read_hidden(self, unit: int):
        """The `hidden` leaf of one unit (StateImage pools), without an eager device op."""
        return _gather([self.tree["hidden"]], self._idx([unit]))[0][0]

    def warm_up(self, max_units: int) -> None:
        """Compile the byte movers for every index bucket up to `max_units`, with moves that
        leave every unit as it was (read, write the same bytes back, copy a unit onto itself)."""
        k = 1
        while k <= min(max_units, self.capacity):
            units = list(range(k))
            self.write_units(units, self.read_units(units))
            self.copy_units(units, units)
            k *= 2
        if "hidden" in getattr(self.tree, "keys", lambda: ())():
            self.read_hidden(0)

    def copy_units(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Device-to-device unit copies (copy-on-write of a tail page, BIND-4)."""
        self._leaves = _copy(self._leaves, self._idx(src), self._idx(dst))
