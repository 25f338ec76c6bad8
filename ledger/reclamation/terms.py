"""The words of reclamation (RCL-1..12, HOST-1..3, WAIT-2, RD-8): who asks for room (`Applicant`,
its `ApplicantKind`), for what (`Gap`: units of a Device pool or bytes of the Host arena), the
physical actions a quote may take (`Action`: delete a group of checkpoints, drop a duplicate
replica, demote content to Host) and what a quote answers (`Quote`: the chosen actions, what
they free and lose, and the states it was read from, RCL-2). Every other module of the package
speaks these; this one imports nothing of it.
"""
from __future__ import annotations

from typing import NamedTuple

from ledger.cache_state import CacheState, Tier
from ledger.errors import InvalidRequest
from ledger.state import DEVICE, HOST, LedgerState

MAX_VICTIM_DEMOTIONS = 8  # demotions needing Host victims quoted per Device quote (RCL-5, bounded)


class ApplicantKind:
    NECESSARY = "necessary"  # admitted execution (RCL-8): any optional content, in order
    CAPTURE = "capture"  # an optional new capture (RCL-10/11, SAVE-5)
    WRITEBACK = "writeback"  # Host write-back of existing content (RCL-10, RCL-12)
    SNAPSHOT = "snapshot"  # a pause Snapshot (RCL-10): optional cache, then later tickets' snapshots


class Applicant(NamedTuple):
    kind: str
    budget: int = 0  # RCL-11: fixed added recovery coverage of a capture without own demand
    demand_time: int = 0  # RCL-9: the candidate position's own repeated demand time (0: none)
    tier: int = Tier.NORMAL  # the owner's tier (RCL-10: bounds what a cold capture may replace)
    ticket: int | None = None  # the applicant's original ticket (WAIT-2 / pause snapshots)
    revoke_waiters: bool = False  # WAIT-2, SCH-4: only when ordinary reclamation is not enough
    fresh: bool = False  # fresh admission: revokes only younger waiters, never a paused one
    demote: bool = True  # consider Host demotions (RCL-6)


def budgeted(applicant: Applicant) -> bool:
    """RCL-11: a capture or write-back without its own demand spends a fixed loss budget."""
    return applicant.kind in (ApplicantKind.CAPTURE, ApplicantKind.WRITEBACK) and not applicant.demand_time


class Gap(NamedTuple):
    """The currently scarce resource: units of a Device pool, or bytes of the Host arena."""

    pool: str  # a Device pool id, or HOST
    amount: int  # units, or bytes
    allocations: tuple = ()  # HOST: the allocations that must place first-fit (HOST-1)


class Action(NamedTuple):
    kind: str  # "delete" | "drop_replica" | "demote"
    cids: tuple  # checkpoints deleted (delete) or whose content is demoted
    objects: tuple  # objects whose bytes in the gap's pool are freed (unique)
    frees: int  # amount of the gap freed (units or bytes)
    offsets: tuple  # HOST: arena offsets freed (HOST-1 pre-check)
    loss: int  # recovery tokens lost against the surviving fallback (RCL-5)
    tier: int  # REUSE when it touches hot content (RCL-3)
    demand_time: int
    holders: frozenset  # the real holder set (RCL-1)
    waiters: tuple  # waiting references it revokes (WAIT-2)
    medium: str = DEVICE  # drop_replica: which replica
    host_victims: tuple = ()  # demote: Host actions fixed before sorting (RCL-5)
    revokes: tuple = ()  # tickets of the waiters / pause snapshots it revokes (WAIT-2, SCH-4)


class Ranking(NamedTuple):
    actions: tuple
    excluded: int


class Quote(NamedTuple):
    gap: Gap
    applicant: Applicant
    ranking: object  # `.actions` / `.excluded`; a quote through the victim order computes them on demand
    chosen: tuple  # the selected subset, in order
    freed: int
    loss: int
    admitted: bool
    base: LedgerState
    cache: CacheState
    cold: frozenset = frozenset()  # HEAT-4: owners this quote treated as normal (recorded on commit)

    @property
    def actions(self) -> tuple:
        """Every admissible action, ranked (RCL-4). A quote taken through the victim order
        stops after its picks; reading this enumerates them all (`quote_reference`)."""
        return self.ranking.actions

    @property
    def excluded(self) -> int:
        """Actions this applicant may not take."""
        return self.ranking.excluded


def refused(gap: Gap, applicant: Applicant, ranking, state: LedgerState, cache: CacheState) -> Quote:
    """A quote that admits nothing (no admissible action set closes the gap)."""
    return Quote(gap, applicant, ranking, (), 0, 0, False, state, cache)


def check_quote_args(state: LedgerState, gap, applicant) -> None:
    """A quote is asked for a typed gap of a known pool (or the Host arena) by an Applicant."""
    if not isinstance(gap, Gap) or not isinstance(applicant, Applicant):
        raise InvalidRequest("quote needs a Gap and an Applicant")
    if gap.pool != HOST:
        state.pool(gap.pool)
    if type(gap.amount) is not int or gap.amount <= 0:
        raise InvalidRequest(f"gap amount must be a positive int, got {gap.amount!r}")
