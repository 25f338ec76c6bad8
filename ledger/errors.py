"""Typed errors of the ledger (doctrine 3 of docs/rules.md: bad input gets a clear, typed error).

Ordinary shortage is not an error: planners return a `Refusal` with the exact shortfall per
pool (RES-2). An exception here means the request itself is wrong (bad size, unknown id,
release by a non-holder, an older generation) or a committed plan went stale. Raising never
changes a ledger: the state is immutable and a planner only returns new values.
"""
from __future__ import annotations


class LedgerError(Exception):
    """Base of every error the ledger raises."""


class InvalidRequest(LedgerError, ValueError):
    """A malformed request: negative or absurd size, unknown pool, wrong type, duplicate id."""


class ExceedsCapacity(InvalidRequest):
    """A demand larger than the pool's whole capacity: it can never be granted."""


class UnknownObject(LedgerError):
    """No live physical object has this id (never existed, or already freed)."""


class UnknownPermit(LedgerError):
    """No outstanding permit has this id (never granted, or already settled: double settle)."""


class UnknownLease(LedgerError):
    """No reader lease has this id (never taken, or already released: double release)."""


class NotAHolder(LedgerError):
    """A release by someone who does not hold the reference, lease, pin or permit."""


class AlreadyHolder(LedgerError):
    """The holder already holds this object (references are sets: add once, drop once)."""


class PermitOverdraw(LedgerError):
    """An allocation asks a permit for more units than it still has reserved."""


class ReplicaError(LedgerError):
    """A replica operation that would lose content or touch a protected replica."""


class ArenaError(LedgerError):
    """A Host arena operation on bytes that are not allocated (double free) or not free."""


class TransactionStateError(LedgerError):
    """A context-transaction step out of order (e.g. publish before completion; TXN-1)."""


class StaleGeneration(TransactionStateError):
    """A completion or step names an older transaction generation (TXN-2): ignored, typed."""


class StalePlan(LedgerError):
    """Commit found a precondition of the plan no longer true; nothing was applied."""


class IntegrityError(LedgerError):
    """check_integrity() found the state disagreeing with its own first-principles recount."""


class CapacityConfigError(LedgerError, ValueError):
    """A configuration outside the capacity rules (CFG-2..6); the message names the bound."""
