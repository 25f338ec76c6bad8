"""The steps every driver of the cache policy takes the same way: the engine's
(`ninfer_jax/engine/reuse.py`, `units.py`) and the model-free `CacheSim` (ledger/simulate.py).

A driver runs a request through docs/cache_policy.md's call order; these are the parts of that
order with one right answer, written once so the two drivers cannot drift apart:

* `SavePoint`, a semantic save opportunity the frontend chose (SAVE-1), and the
  `CaptureRequest` it asks for at its frontier (`capture_request`);
* `chunk_end`: where a prefill chunk starting at a frontier ends — at the next semantic
  frontier, never past the chunk size or the end (REC-8, G-6);
* `plan_with_reclaim`: plan, and on a shortfall reclaim for it and plan again at once (RES-4),
  at most MAX_RETRIES times; each driver says how it reclaims (the engine's quotes respect an
  in-flight transaction and its revocation limits, the sim's run the transaction at once);
* the reading of a policy result's outcome log: the view a bind hands over with the permit it
  took (`bound_view`, BIND-*, TXN-2), and what a capture kept and skipped (`captured`,
  SAVE-4/5). The ledger notes its outcomes as typed records (`CacheResult.outcome`, one
  ledger/outcomes.py record per event); these readers are the convenience drivers use, so that
  a driver asks for a bind's view or a capture's counts rather than walking the log.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

from ledger.cache_state import InputKind, PointKind
from ledger.capture import CaptureRequest, SequenceView
from ledger.outcomes import SAVED, SKIPPED, PermitTaken, View
from ledger.plan import Refusal

MAX_RETRIES = 4  # RES-4: reclaim-and-replan rounds before a shortfall is the answer


class SavePoint(NamedTuple):
    """A semantic save opportunity the frontend chose (SAVE-1): where a chunk must end and
    what to capture there."""

    frontier: int
    private: str | None = PointKind.INPUT  # INPUT | ANCHOR | None (shared only)
    input_kind: str = InputKind.RAW
    shared: bool = False
    explicit: bool = True


def capture_request(view: SequenceView, save: SavePoint) -> CaptureRequest:
    """SAVE-*: the capture `save` asks for, with `view` at its frontier."""
    return CaptureRequest(view, save.private, save.input_kind, shared=save.shared, explicit=save.explicit)


def chunk_end(at: int, end: int, splits: Sequence[int], chunk: int) -> int:
    """REC-8: the end of the prefill chunk starting at `at`: the first of `splits` (sorted
    frontiers) inside (at, end), else `end`; at most `chunk` tokens. A chunk end by itself is
    never a save (G-6)."""
    end = next((f for f in splits if at < f < end), end)
    return min(at + chunk, end)


class BoundView(NamedTuple):
    """What a bind hands the writer (BIND-*): its StateImage object, its pages per KV pool, and
    the unit permit taken with the bind (TXN-2), if one was."""

    state_object: int
    kv: tuple  # ((pool, (page object ids in position order)), ...)
    permit: int | None

    def pages(self, pool: str) -> tuple[int, ...]:
        return dict(self.kv).get(pool, ())


class Captured(NamedTuple):
    """What one capture did (SAVE-*): points kept (private and shared) and parts skipped."""

    kept: int
    skipped: int


def bound_view(result) -> BoundView:
    """The view and permit a successful bind (`plan_bind`'s result) noted."""
    view = [o for o in result.outcome if isinstance(o, View)][0]
    permit = next((o.permit for o in result.outcome if isinstance(o, PermitTaken)), None)
    return BoundView(view.state_object, view.kv, permit)


def captured(result) -> Captured:
    """Points a capture (`plan_capture`'s result) kept, and the parts it skipped (SAVE-4)."""
    kept = sum(1 for o in result.outcome if isinstance(o, SAVED))
    skipped = sum(1 for o in result.outcome if isinstance(o, SKIPPED))
    return Captured(kept, skipped)


def plan_with_reclaim(make: Callable[[], object], reclaim: Callable[[dict], bool], tries: int = MAX_RETRIES):
    """RES-4: `make()` a plan; while it is refused for a shortfall, `reclaim(pools)` the missing
    units (a {pool: amount} dict) and plan again, at most `tries` times. Returns the plan, or the
    last Refusal: a refusal for another reason, or a shortfall reclamation could not meet."""
    got = make()
    for _ in range(tries):
        if not isinstance(got, Refusal) or got.reason != "shortfall" or not got.shortfall:
            return got
        if not reclaim(dict(got.shortfall.pools)):
            return got
        got = make()
    return got
