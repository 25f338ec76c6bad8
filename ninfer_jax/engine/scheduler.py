"""The fresh queue: FIFO tickets with bounded overtaking (SCH-2, SCH-3).

A scan looks at the head and at most C following candidates. A younger request may be
admitted past a blocked older one, but each blocked request can be overtaken successfully at
most C times; after that nothing younger passes it until it is admitted. A failed check spends
no quota. Scans run only when something changed (a submission, a release, a cancel): under the
same event a request that already failed is not quoted again. A candidate that waits for the
copy in flight (`WAIT`) ends the scan unfinished: its followers would wait for the same
copy, and the scan resumes by ticket when it ends (SCH-2, SCH-3).
"""
from __future__ import annotations

import bisect
from typing import Callable, Generic, TypeVar

T = TypeVar("T")
WAIT = "wait"  # what `try_admit` returns when its candidate waits for the transfer in flight


class FreshQueue(Generic[T]):
    def __init__(self, max_concurrency: int, ticket: Callable[[T], int]):
        self.c = max_concurrency
        self._ticket = ticket
        self._items: list[T] = []
        self._tickets: list[int] = []
        self.overtaken: dict[int, int] = {}  # ticket -> successful overtakes suffered
        self.dirty = True  # a scan is due (SCH-3)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(list(self._items))

    def push(self, item: T) -> None:
        """Insert by original ticket (a paused request returns to its place, SCH-6)."""
        t = self._ticket(item)
        i = bisect.bisect_left(self._tickets, t)
        self._tickets.insert(i, t)
        self._items.insert(i, item)
        self.dirty = True

    def remove(self, item: T) -> bool:
        t = self._ticket(item)
        i = bisect.bisect_left(self._tickets, t)
        if i < len(self._tickets) and self._tickets[i] == t:
            del self._tickets[i], self._items[i]
            self.overtaken.pop(t, None)
            self.dirty = True
            return True
        return False

    def first(self, n: int) -> list[T]:
        """The head and its followers, at most `n`, in ticket order (a copy)."""
        return self._items[:n]

    def head(self) -> T | None:
        return self._items[0] if self._items else None

    def scan(self, lanes_free: int, try_admit: Callable[[T], bool | str]) -> list[T]:
        """Admit in ticket order from the head and at most C followers, while lanes are free;
        a `WAIT` answer ends the scan there."""
        if not self.dirty or not self._items:
            return []
        self.dirty = False
        admitted: list[T] = []
        blocked: list[int] = []
        for item in list(self._items[:self.c + 1]):
            if len(admitted) >= lanes_free:
                break
            if any(self.overtaken.get(b, 0) >= self.c for b in blocked):
                break  # SCH-2: an older blocked request has been overtaken C times already
            got = try_admit(item)
            if got == WAIT:
                break
            if got:
                admitted.append(item)
                self.remove(item)
                for b in blocked:
                    self.overtaken[b] = self.overtaken.get(b, 0) + 1
            else:
                blocked.append(self._ticket(item))
        self.dirty = False  # removals above set it; this scan has seen them
        return admitted
