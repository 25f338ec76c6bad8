"""A device pool: a pytree of JAX arrays that share a leading unit axis (pages or slots).

Main KV is one such pool (per attention layer, K and V `[num_pages, 64, kv_heads, head_dim]`),
StateImage slots another (per GDN layer conv `[slots, K-1, conv_dim]` and recurrent
`[slots, H, Dk, Dv]` float32, plus the continuation hidden `[slots, hidden]`). The pool does
not care what the leaves are: the model defines its exact pytree, the ledger sees a unit of
`unit_bytes` bytes. One unit's bytes are its leaves' unit slices in tree-flatten order; that
is the layout of its Host replica.

Byte movers, compiled once per power-of-two index bucket at warm-up (`warm_up`, every bucket
up to the pool's size, so nothing compiles mid-run however many units one plan moves):
  pack     units -> their Host layout on device, uint8 `[b, unit_bytes]` (the gather and the
           byte packing are one device program, so the host receives exactly the arena bytes);
  unpack   uint8 `[b, unit_bytes]` already on device -> units (donates the pool);
  copy     unit -> unit of the same pool (copy-on-write, BIND-4; donates the pool).
`pack`/`unpack` take exactly a bucket's worth of units: callers split a unit list into
power-of-two pieces (`pow2_pieces`), so no index list or byte row is ever padded on the host
(no copy to pad, no bytes moved twice). `copy` is device-only, so its index vectors are padded
to the bucket (a repeated pair rewrites the same unit with the same bytes).

Only the Program calls these methods; the ledger has already checked every index.
"""
from __future__ import annotations

import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ledger import KV_PAGES, STATE_SLOTS, PoolSpec
from ninfer_jax.compile_cache import compile_counted
from pallas_kernels._common import unpacked


def bucket(k: int) -> int:
    """The power of two at or above `k` (index buckets)."""
    return 1 << max(0, (k - 1).bit_length())


def pow2_pieces(n: int) -> list[int]:
    """`n` as a sum of distinct powers of two, largest first (63 -> 32, 16, 8, 4, 2, 1)."""
    return [1 << b for b in range(n.bit_length() - 1, -1, -1) if n >> b & 1]


def pow2_upto(n: int) -> list[int]:
    """Every power of two up to `n` (1, 2, 4, ...); [] for n < 1."""
    return [1 << b for b in range(n.bit_length())] if n >= 1 else []


def mover_buckets(units: int) -> dict[str, list[int]]:
    """The index buckets of a pool of `units` units: pack and unpack every power of two within
    the pool, copy every one up to the power of two at or above it (`UnitPool.buckets`,
    `ninfer lower`)."""
    within = pow2_upto(1 << (units.bit_length() - 1))
    return {"pack": within, "unpack": within, "copy": pow2_upto(bucket(units))}


def _as_bytes(x):
    """[k, n] of any dtype -> [k, n * itemsize] uint8, native byte order (numpy's `.view`)."""
    if x.dtype == jnp.uint8:
        return x
    return jax.lax.bitcast_convert_type(x, jnp.uint8).reshape(x.shape[0], -1)


def _from_bytes(b, dtype, shape):
    """uint8 [k, nbytes] -> [k, *shape] of `dtype` (the inverse of `_as_bytes`)."""
    dtype = jnp.dtype(dtype)
    k = b.shape[0]
    if dtype == jnp.uint8:
        x = b
    elif dtype.itemsize == 1:
        x = jax.lax.bitcast_convert_type(b, dtype)
    else:
        x = jax.lax.bitcast_convert_type(b.reshape(k, -1, dtype.itemsize), dtype)
    return x.reshape((k,) + tuple(shape))


def _pack(leaves, idx):  # leaves: list of [units, ...]; idx: [b] -> uint8 [b, unit_bytes]
    k = idx.shape[0]
    cols = [_as_bytes(jnp.take(leaf, idx, axis=0).reshape(k, -1)) for leaf in leaves]
    return cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=1)


def _unpack(leaves, idx, rows):  # rows: uint8 [b, unit_bytes]
    out, a = [], 0
    for leaf in leaves:
        n = math.prod(leaf.shape[1:]) * jnp.dtype(leaf.dtype).itemsize
        out.append(leaf.at[idx].set(_from_bytes(rows[:, a:a + n], leaf.dtype, leaf.shape[1:])))
        a += n
    return out


def _copy(leaves, src, dst):  # src, dst: [b]
    return [leaf.at[dst].set(jnp.take(leaf, src, axis=0)) for leaf in leaves]


def _hidden(leaf, idx):  # one unit's row of the `hidden` leaf, as numbers (a packed pool's bits)
    return unpacked(jnp.take(leaf, idx, axis=0)[0])


_JIT = {
    "pack": jax.jit(_pack),
    "unpack": jax.jit(_unpack, donate_argnums=(0,)),
    "copy": jax.jit(_copy, donate_argnums=(0,)),
    "hidden": jax.jit(_hidden),
}


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
        if any(l.dtype == jnp.bool_ for l in leaves):
            raise ValueError(f"pool {pool_id!r}: bool leaves have no byte layout")
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
        self.device = next(iter(leaves[0].devices()))
        # The continuation hidden of a StateImage pool: a top-level "hidden" leaf.
        paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
        self._hidden_index = next((i for i, p in enumerate(paths) if len(p) == 1 and getattr(p[0], "key", None) == "hidden"),
                                  None)
        self._executables: dict[tuple, Any] = {}
        # (mover, bucket, seconds, from_cache): each executable built, counted; from_cache when
        # JAX's persistent compilation cache answered it
        self.compilations: list[tuple[str, int, float, bool]] = []

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

    # -- compiled movers -------------------------------------------------------------------
    @property
    def max_piece(self) -> int:
        """The largest pack/unpack bucket: the largest power of two within the pool."""
        return 1 << (self.capacity.bit_length() - 1)

    def buckets(self) -> dict[str, list[int]]:
        """Every bucket each mover is compiled for at warm-up."""
        out = mover_buckets(self.capacity)
        if self._hidden_index is not None:
            out["hidden"] = [1]
        return out

    def _executable(self, mover: str, b: int):
        exe = self._executables.get((mover, b))
        if exe is not None:
            return exe
        t0 = time.perf_counter()
        spec = [jax.ShapeDtypeStruct(shape, dtype, sharding=l.sharding)
                for (shape, dtype), l in zip(self._shapes, self._leaves)]
        idx = jax.ShapeDtypeStruct((b,), jnp.int32)
        if mover == "pack":
            args = (spec, idx)
        elif mover == "unpack":
            rows = jax.ShapeDtypeStruct((b, self.unit_bytes), jnp.uint8,
                                        sharding=jax.sharding.SingleDeviceSharding(self.device))
            args = (spec, idx, rows)
        elif mover == "copy":
            args = (spec, idx, idx)
        elif mover == "hidden":
            args = (spec[self._hidden_index], idx)
        else:
            raise ValueError(f"unknown mover {mover!r}")
        exe, from_cache = compile_counted(_JIT[mover].lower(*args))
        self._executables[(mover, b)] = exe
        self.compilations.append((mover, b, time.perf_counter() - t0, from_cache))
        return exe

    def warm_up(self, max_units: int | None = None) -> int:
        """Compile every mover for every bucket up to the pool's size (or `max_units`) without
        running one (a move of the whole pool would cost its bytes twice over). Returns how many
        executables this built."""
        before = len(self.compilations)
        for mover, sizes in self.buckets().items():
            for b in sizes:
                if max_units is None or b <= max(1, max_units):
                    self._executable(mover, b)
        return len(self.compilations) - before

    def _check_piece(self, k: int) -> None:
        if k < 1 or k & (k - 1) or k > self.max_piece:
            raise ValueError(f"pool {self.pool_id!r}: a piece of {k} units; expected a power of two <= {self.max_piece}")

    # -- byte movement --------------------------------------------------------------------
    def pack(self, units: Sequence[int]) -> jax.Array:
        """Dispatch the packing of `units` (a power-of-two count): uint8 `[k, unit_bytes]` on
        device, not waited for."""
        self._check_piece(len(units))
        return self._executable("pack", len(units))(self._leaves, np.asarray(units, np.int32))

    def unpack(self, units: Sequence[int], rows: jax.Array) -> None:
        """Dispatch writing device bytes `rows` (uint8 `[k, unit_bytes]`, k a power of two)
        into `units`; the pool is donated and replaced, nothing is waited for."""
        self._check_piece(len(units))
        self._leaves = self._executable("unpack", len(units))(self._leaves, np.asarray(units, np.int32), rows)

    def copy_units(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Device-to-device unit copies (copy-on-write of a tail page, BIND-4), in one program."""
        src, dst = list(src), list(dst)
        if len(src) != len(dst) or not src:
            raise ValueError(f"pool {self.pool_id!r}: {len(src)} sources for {len(dst)} destinations")
        pad = bucket(len(src)) - len(src)
        s = np.asarray(src + [src[-1]] * pad, np.int32)
        d = np.asarray(dst + [dst[-1]] * pad, np.int32)
        self._leaves = self._executable("copy", len(s))(self._leaves, s, d)

    def read_units(self, units: Sequence[int]) -> np.ndarray:
        """Bytes of the given units: uint8 [k, unit_bytes] (a new host array; waits)."""
        units = list(units)
        out = np.empty((len(units), self.unit_bytes), np.uint8)
        at, parts = 0, []
        for k in pow2_pieces(len(units)):
            parts.append((at, k, self.pack(units[at:at + k])))
            at += k
        for at, k, dev in parts:
            np.copyto(out[at:at + k], np.asarray(dev))
        return out

    def write_units(self, units: Sequence[int], data: np.ndarray) -> None:
        """Set the given units from bytes uint8 [k, unit_bytes] (dispatched, not waited for)."""
        units = list(units)
        data = np.ascontiguousarray(np.asarray(data, dtype=np.uint8).reshape(len(units), self.unit_bytes))
        sharding = jax.sharding.SingleDeviceSharding(self.device)
        at = 0
        for k in pow2_pieces(len(units)):
            self.unpack(units[at:at + k], jax.device_put(data[at:at + k], sharding))
            at += k

    def read_hidden(self, unit: int):
        """The `hidden` leaf of one unit (StateImage pools), on device, without an eager op."""
        if self._hidden_index is None:
            raise ValueError(f"pool {self.pool_id!r} has no hidden leaf")
        return self._executable("hidden", 1)(self._leaves[self._hidden_index], np.asarray([unit], np.int32))
