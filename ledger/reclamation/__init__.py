"""Reclamation: making room in a scarce Device pool or the Host arena from optional cache (RCL-1..12,
HOST-1..3, WAIT-2, HEAT-1..4, RD-8), in four parts, each importing only the parts before it. The
pricing of a recovery loss per freed unit (pricing.py: fallbacks, losses, tiers, the rank and the
admission table, on the shared words of terms.py and the exact prefixes of prefixes.py); the
victim index (index.py, the pure data, and index_*.py, which key it, build it from scratch and
carry it to each cache edit's diff and the ledger's replica diff; demand.py, the HEAT evidence
that moves its tiers); the selection (candidates.py, selection.py, host_selection.py, reference.py:
the full enumeration; ranked_device.py, ranked_host.py, demotion_*.py: the same selection through
the index; quotes.py: the entry points); and the edit it produces (edit.py, the cache edit every
policy operation goes through; apply.py, a quote's victim set as such an edit). Re-exported below:
the entry points the ledger exports and the policy modules use.
"""
from ledger.reclamation.apply import apply_quote, plan_reclaim, safely_removable
from ledger.reclamation.demand import observe_prefill, rebalance_tiers
from ledger.reclamation.edit import CacheResult, Edit
from ledger.reclamation.quotes import QuoteFacts, gap_order, quote, quote_facts
from ledger.reclamation.reference import quote_reference
from ledger.reclamation.terms import Action, Applicant, ApplicantKind, Gap, Quote

__all__ = ("Action", "Applicant", "ApplicantKind", "CacheResult", "Edit", "Gap", "Quote", "QuoteFacts",
           "apply_quote", "gap_order", "observe_prefill", "plan_reclaim", "quote", "quote_facts", "quote_reference",
           "rebalance_tiers", "safely_removable")
