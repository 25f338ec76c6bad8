"""Prometheus metrics of the engine, read from `engine.stats()` at scrape time.

The same counters gRPC `GetStats` returns (one source of truth: the engine's OBS-1 counters),
exported in the field's style: an `ninfer:` prefix, `_total` counters, base units (seconds,
bytes), labels for what a counter splits by. Nothing is counted twice on the way: a scrape
builds the families from one stats snapshot. An engine that does not report a key (the fake
engine, or before warm-up) exports what it has.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

P = "ninfer:"
# (metric, help, [(label values, stats key)])
COUNTERS: tuple[tuple[str, str, tuple[str, ...], tuple[tuple[tuple[str, ...], str], ...]], ...] = (
    ("prompt_tokens", "Prompt tokens of submitted requests.", (), (((), "prompt_tokens"),)),
    ("generation_tokens", "Generated tokens.", (), (((), "generated_tokens"),)),
    ("cached_prompt_tokens", "Prompt tokens served from the context cache (usage.cached_tokens).", (),
     (((), "cached_tokens"),)),
    ("reused_tokens", "Tokens of cached sources bound at admission.", (), (((), "reused_tokens"),)),
    ("prefill_tokens", "Tokens computed by prefill.", (), (((), "prefill_tokens"),)),
    ("replay_tokens", "Tokens recomputed to resume paused requests (Replay).", (), (((), "replay_tokens"),)),
    ("cache_queries", "Fresh admissions that queried the context cache.", (), (((), "cache_queries"),)),
    ("cache_hits", "Fresh admissions that bound a cached source, by source kind.", ("source",),
     ((("private",), "cache_hits_private"), (("shared",), "cache_hits_shared"))),
    ("pauses", "Pauses of running requests, by route.", ("route",),
     ((("snapshot",), "pauses_snapshot"), (("replay",), "pauses_replay"))),
    ("resumes", "Resumes of paused requests, by route.", ("route",),
     ((("snapshot",), "resumes_snapshot"), (("replay",), "resumes_replay"))),
    ("capacity_errors", "Requests ended because they cannot fit even alone (RES-6).", (),
     (((), "capacity_errors"),)),
    ("queue_full_errors", "Requests refused because the queue was full.", (), (((), "queue_full_errors"),)),
    ("transfer_bytes", "Bytes copied between Device and Host.", ("direction",),
     ((("h2d",), "h2d_bytes"), (("d2h",), "d2h_bytes"))),
    ("requests", "Requests that ended, by outcome.", ("outcome",),
     ((("finished",), "requests_finished"), (("cancelled",), "requests_cancelled"),
      (("failed",), "requests_failed"))),
    ("requests_submitted", "Requests submitted.", (), (((), "requests_submitted"),)),
    ("spec_draft_tokens", "Draft tokens the MTP head proposed (speculative decoding).", (),
     (((), "spec_drafted_tokens"),)),
    ("spec_accepted_tokens", "Draft tokens accepted by verification and emitted.", (),
     (((), "spec_accepted_tokens"),)),
    ("spec_rejected_tokens", "Draft tokens not emitted (rejected, or after a rejection or a stop).", (),
     (((), "spec_rejected_tokens"),)),
    ("spec_verify_units", "Verify units run (one per decoding row and step).", (), (((), "spec_verify_units"),)),
    ("vision_encodes", "Images and videos the vision tower encoded (each item, each time).", (),
     (((), "vision_encodes"),)),
    ("vision_reencodes", "Encodings of an item its request had encoded before (its output had left the media "
     "cache; PAUSE-6).", (), (((), "vision_reencodes"),)),
    ("media_cache_hits", "Prefill chunks that found an item's vision tower output in the media cache.", (),
     (((), "media_cache_hits"),)),
)
GAUGES = (
    ("requests_running", "Requests holding a lane.", "residents"),
    ("requests_waiting", "Requests in the fresh queue.", "queued"),
    ("requests_paused", "Paused requests.", "paused"),
    ("spec_mean_accepted_length", "Tokens emitted per Verify unit (1 + accepted drafts), since start.",
     "spec_mean_accepted_length"),
    ("media_cache_bytes", "Bytes of vision tower outputs kept in the media cache.", "media_cache_bytes"),
)
HISTOGRAMS = (
    ("time_to_first_token_seconds", "Submission to first token.", "time_to_first_token_seconds"),
    ("inter_token_latency_seconds", "Gap between consecutive output tokens.", "inter_token_seconds"),
    ("e2e_request_latency_seconds", "Submission to the end of the request.", "e2e_seconds"),
    ("request_queue_time_seconds", "Submission to first admission.", "queue_seconds"),
)


def families(stats: dict[str, Any]) -> Iterator:
    """The metric families of one stats snapshot."""
    for name, doc, labels, series in COUNTERS:
        fam = CounterMetricFamily(P + name, doc, labels=list(labels))
        present = False
        for values, key in series:
            if key in stats:
                fam.add_metric(list(values), float(stats[key]))
                present = True
        if present:
            yield fam
    for name, doc, key in GAUGES:
        if key in stats:
            yield GaugeMetricFamily(P + name, doc, value=float(stats[key]))
    if stats.get("spec_accepted_by_position"):
        fam = CounterMetricFamily(P + "spec_accepted_tokens_by_position",
                                  "Accepted draft tokens by draft position (1 = the first draft).", labels=["position"])
        for i, n in enumerate(stats["spec_accepted_by_position"]):
            fam.add_metric([str(i + 1)], float(n))
        yield fam
    used = GaugeMetricFamily(P + "pool_units_used", "Device pool units in use.", labels=["pool"])
    total = GaugeMetricFamily(P + "pool_units_total", "Device pool units.", labels=["pool"])
    for key, value in stats.items():
        if key.startswith("pool_") and key.endswith("_used"):
            used.add_metric([key[5:-5]], float(value))
        elif key.startswith("pool_") and key.endswith("_total"):
            total.add_metric([key[5:-6]], float(value))
    yield used
    yield total
    if "host_bytes_total" in stats:
        yield GaugeMetricFamily(P + "host_arena_bytes_total", "Host arena capacity.", value=float(stats["host_bytes_total"]))
        host = GaugeMetricFamily(P + "host_arena_bytes_used", "Host arena bytes in use, by object kind.", labels=["kind"])
        for key, value in stats.items():
            if key.startswith("host_bytes_") and key not in ("host_bytes_total", "host_bytes_used"):
                host.add_metric([key[len("host_bytes_"):]], float(value))
        yield host
    for name, doc, key in HISTOGRAMS:
        h = (stats.get("histograms") or {}).get(key)
        if h is None:
            continue
        fam = HistogramMetricFamily(P + name, doc)
        running, buckets = 0, []
        for bound, n in zip(list(h["buckets"]) + [float("inf")], h["counts"]):
            running += n
            buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        fam.add_metric([], buckets, sum_value=h["sum"])
        yield fam


class EngineCollector(Collector):
    """Collects from whatever engine `get_engine()` returns at scrape time (None: nothing)."""

    def __init__(self, get_engine: Callable[[], Any]):
        self._get_engine = get_engine

    def collect(self):
        engine = self._get_engine()
        if engine is None:
            return
        yield from families(engine.stats())


def registry_for(get_engine: Callable[[], Any]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(get_engine))
    return registry
