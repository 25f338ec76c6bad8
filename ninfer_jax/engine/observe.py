"""What the engine reports: its counters, latency histograms and pool occupancy.

`COUNTERS` are the OBS-1 counters the core keeps (`EngineCore.counters`, all present from the
start, at zero): requests, tokens by kind, hits, transfers, pauses and resumes by route,
captures, reclamations, speculative decoding.

Latency histograms (OBS-1..4): time to first token, the gap between output tokens, end to end
and time in the queue, observed on the Program's clock as events happen.

Fixed buckets (Prometheus' convention: upper bounds, cumulative when exported), so an
observation is one bisect and the snapshot is a few lists: `engine.stats()["histograms"]`,
which the HTTP `/metrics` exports (server/metrics.py) and gRPC `GetStats` leaves out (it
carries scalars only).
"""
from __future__ import annotations

import bisect

import ledger

COUNTERS = (
    "requests_submitted", "requests_finished", "requests_cancelled", "requests_failed",
    "prompt_tokens", "prefill_tokens", "replay_tokens", "reused_tokens", "cached_tokens",
    "generated_tokens", "cache_hits", "h2d_bytes", "d2h_bytes",
    "pauses_replay", "pauses_snapshot", "resumes_replay", "resumes_snapshot",
    "snapshot_bytes", "snapshot_revocations", "snapshot_fallbacks", "recovery_permit_seconds",
    "capacity_errors", "queue_full_errors", "cycles", "decode_steps", "prefill_chunks",
    "captures", "captures_skipped", "reclaims", "reclaim_quotes", "full_hits", "waits",
    "cache_queries", "cache_hits_private", "cache_hits_shared", "branch_points",
    "spec_verify_units", "spec_drafted_tokens", "spec_accepted_tokens",
    "vision_encodes", "vision_reencodes", "media_cache_hits",
)

# Seconds: from a fast decode step on a GPU to a long prefill queue on a busy CPU.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   120.0, 300.0)
NAMES = ("time_to_first_token_seconds", "inter_token_seconds", "e2e_seconds", "queue_seconds")


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds=LATENCY_BUCKETS):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> dict:
        return {"buckets": list(self.bounds), "counts": list(self.counts), "sum": self.sum, "count": self.count}


def latency_histograms() -> dict[str, Histogram]:
    return {name: Histogram() for name in NAMES}


def occupancy(state: ledger.LedgerState) -> dict[str, int]:
    """Units in use and in all per Device pool, Host arena bytes in use by object kind. Host
    replicas are read from the objects whose replicas differ from one Device copy (`xrep`), so
    this costs the Host-resident objects, not every object."""
    out: dict[str, int] = {}
    for pid, pool in state.pools.items():
        out[f"pool_{pid}_total"] = pool.spec.capacity
        out[f"pool_{pid}_used"] = pool.spec.capacity - len(pool.free)
    out["host_bytes_total"] = state.arena.capacity
    out["host_bytes_used"] = state.arena.used_bytes
    by_kind = {ledger.KV_PAGE: 0, ledger.STATE_IMAGE: 0}
    for oid, _ in state.xrep.items():
        o = state.objects.get(oid)
        if o is not None and o.host is not None:
            by_kind[o.kind] = by_kind.get(o.kind, 0) + o.host.nbytes
    for kind, n in by_kind.items():
        out[f"host_bytes_{kind}"] = n
    return out
