"""A persistent map from non-negative ints to values with a structural diff.

Used for the ledger's replica exceptions (`LedgerState.xrep`): which objects do not have
exactly one complete Device replica. A 32-way radix trie of tuples: `set`/`delete` copy one
path (a few small tuples); `diff(a, b)` walks only the nodes the two versions do not share, so
a reader that kept an older version learns what changed in time proportional to the change,
whatever lineage the two versions come from (a value compare settles every difference).
"""
from __future__ import annotations

from typing import Iterator, NamedTuple

_BITS = 5
_WIDTH = 1 << _BITS
_MASK = _WIDTH - 1
_NONE32 = (None,) * _WIDTH


class Trie(NamedTuple):
    depth: int  # levels below the root (keys < 32 ** depth)
    root: tuple | None
    size: int

    def get(self, key: int, default=None):
        if key >> (_BITS * self.depth):
            return default
        node = self.root
        shift = _BITS * (self.depth - 1)
        while node is not None:
            got = node[(key >> shift) & _MASK]
            if shift == 0:
                return default if got is None else got
            node = got
            shift -= _BITS
        return default

    def __contains__(self, key: int) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return self.size

    def items(self) -> Iterator[tuple[int, object]]:
        yield from _items(self.root, self.depth, 0)


EMPTY = Trie(1, None, 0)


def _items(node, depth: int, base: int):
    if node is None:
        return
    if depth == 1:
        for i, v in enumerate(node):
            if v is not None:
                yield base | i, v
        return
    shift = _BITS * (depth - 1)
    for i, child in enumerate(node):
        if child is not None:
            yield from _items(child, depth - 1, base | (i << shift))


def _set(node, depth: int, key: int, value):
    """Returns (new node, size delta). `value` None deletes."""
    i = (key >> (_BITS * (depth - 1))) & _MASK
    base = node if node is not None else _NONE32
    if depth == 1:
        old = base[i]
        if old is value or (old is not None and value is not None and old == value):
            return node, 0
        delta = (value is not None) - (old is not None)
        new = base[:i] + (value,) + base[i + 1:]
    else:
        child, delta = _set(base[i], depth - 1, key, value)
        if child is base[i]:
            return node, 0
        new = base[:i] + (child,) + base[i + 1:]
    if new == _NONE32:
        return None, delta
    return new, delta


def set_(t: Trie, key: int, value) -> Trie:
    """A new trie with key -> value (`value` None: delete)."""
    if key < 0:
        raise ValueError("trie keys are non-negative")
    depth, root = t.depth, t.root
    while key >> (_BITS * depth):
        if value is None:
            return t
        root = None if root is None else (root,) + _NONE32[1:]
        depth += 1
    new, delta = _set(root, depth, key, value)
    if new is root and depth == t.depth:
        return t
    return Trie(depth, new, t.size + delta)


def delete(t: Trie, key: int) -> Trie:
    return set_(t, key, None)


def _lift(t: Trie, depth: int):
    root = t.root
    for _ in range(depth - t.depth):
        root = None if root is None else (root,) + _NONE32[1:]
    return root


def diff(a: Trie, b: Trie) -> Iterator[tuple[int, object, object]]:
    """(key, value in a, value in b) for every key whose values differ (None: absent)."""
    if a is b:
        return
    depth = max(a.depth, b.depth)
    yield from _diff(_lift(a, depth), _lift(b, depth), depth, 0)


def _diff(x, y, depth: int, base: int):
    if x is y:
        return
    if x is None:
        for k, v in _items(y, depth, base):
            yield k, None, v
        return
    if y is None:
        for k, v in _items(x, depth, base):
            yield k, v, None
        return
    if depth == 1:
        for i in range(_WIDTH):
            u, v = x[i], y[i]
            if u is not v and u != v:
                yield base | i, u, v
        return
    shift = _BITS * (depth - 1)
    for i in range(_WIDTH):
        u, v = x[i], y[i]
        if u is not v:
            yield from _diff(u, v, depth - 1, base | (i << shift))


def from_items(pairs) -> Trie:
    t = EMPTY
    for k, v in pairs:
        t = set_(t, k, v)
    return t
