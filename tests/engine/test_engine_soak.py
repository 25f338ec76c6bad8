"""A randomized pressure soak (doctrine 1 and 2 under load; harness in soak.py).

Chat sessions with tool calls, retries and edited history, raw prompts sharing prefixes,
greedy and seeded sampling with stop strings, cancels aimed at every phase, at capacities
near their lower bounds (Main KV one page above the CFG-6 minimum, 0-2 spare StateImage slots,
a Host arena of 0 or a few StateImages). Every finished request equals a cold engine's run
(tokens, text, prompt ids); a cancelled one is a prefix of it; check_integrity() holds after
every cycle; at the end nothing is held. Both pause routes must really pause (PAUSE-2).

    pytest tests/engine/test_engine_soak.py -s                  # the short seeded CI run
    pytest tests/engine/test_engine_soak.py -s --budget=1800    # plus 30 minutes of random configs

A failure names the seed, the configuration, the request and what differed, with a command
that reruns (and shrinks) it: `python tests/engine/soak.py --config ... --seed N --shrink`; the
failing run's exact schedule is saved (to $NINFER_SOAK_DIR or the temp dir) for
`python tests/engine/soak.py --replay FILE.json [--trace] [--shrink]`. A token difference is
classified by the logits at the first differing position: "state" (different logits: a reuse,
pause or binding bug) or "numeric" (the same distribution within float32 noise: a near-tie draw
flipped because some step is not bit-identical to the cold run's); both fail. There is no
tolerance: batching is bit-identical (test_engine_batch_invariant.py).
"""
import collections
import json
import os
import random
import time

import pytest

from soak import PHASES, Soak, SoakConfig, random_config, replay

# Each request fits alone; together they do not (C rows of ~60-200 tokens against 5 pages).
CI_CONFIGS = (
    SoakConfig(route="snapshot", c=3, ctx=256, chunk=16, kv=1, slots=1, host=8),
    SoakConfig(route="replay", c=2, ctx=256, chunk=32, kv=1, slots=0, host=0),
    SoakConfig(route="auto", c=4, ctx=256, chunk=32, kv=1, slots=2, host=3),
    # MTP speculative decoding (issue 17): Verify units reserve their speculative peak.
    SoakConfig(route="auto", c=3, ctx=256, chunk=16, kv=1, slots=1, host=3, mtp=3),
)
CI_SEEDS = (0,)  # one run per configuration: each engine's warm-up (~10 s) dominates the time
CI_REQUESTS = 16  # 4 configurations x 16 = 64 requests
BUDGET_SEEDS_PER_CONFIG = 3
BUDGET_REQUESTS = 24


@pytest.fixture(scope="module")
def soak(tiny_model):
    s = Soak(tiny_model)
    yield s
    print("\n" + s.summary())


def _failure_text(failures, limit: int = 3) -> str:
    """Distinct failures (by signature): the first of each in full, then every failed run's headline."""
    groups = collections.OrderedDict()
    for f in failures:
        groups.setdefault(f.signature, []).append(f)
    out = [f"{len(failures)} failed runs, {len(groups)} distinct failures:"]
    for i, (sig, fs) in enumerate(groups.items()):
        if i < limit:
            out.append(f"--- {sig} ({len(fs)} runs) ---\n{fs[0]}")
        else:
            out.append(f"--- {sig} ({len(fs)} runs): {str(fs[0]).splitlines()[0]}")
    out.append("every failed run:")
    out += [f"  {f.signature}: " + " | ".join(str(f).splitlines()[:2]) for f in failures]
    return "\n".join(out)


def _check_routes(reports, where: str) -> None:
    """PAUSE-2: a Snapshot configuration really pauses by Snapshot, a Replay one by Replay
    only, and "auto" really pauses."""
    by = collections.defaultdict(collections.Counter)
    for r in reports:
        by[r.cfg.route].update({k: r.stats.get(k, 0) for k in
                                ("pauses_snapshot", "pauses_replay", "resumes_snapshot", "resumes_replay")})
    if "snapshot" in by:
        assert by["snapshot"]["pauses_snapshot"] > 0, (
            f"{where}: no pause by Snapshot in pause_route='snapshot' configurations ({dict(by['snapshot'])})")
    if "replay" in by:
        assert by["replay"]["pauses_replay"] > 0, (
            f"{where}: no pause by Replay in pause_route='replay' configurations ({dict(by['replay'])})")
        assert by["replay"]["pauses_snapshot"] == 0, (
            f"{where}: pause_route='replay' paused by Snapshot ({dict(by['replay'])})")
    if "auto" in by:
        assert by["auto"]["pauses_snapshot"] + by["auto"]["pauses_replay"] > 0, (
            f"{where}: pause_route='auto' configurations never paused ({dict(by['auto'])})")


@pytest.mark.parametrize("cfg", CI_CONFIGS, ids=lambda c: c.route + (f"-mtp{c.mtp}" if c.mtp else ""))
def test_soak_ci(soak, cfg):
    n_fail = len(soak.failures)
    reports = [r for r in (soak.run(cfg, seed, CI_REQUESTS) for seed in CI_SEEDS) if r is not None]
    failures = soak.failures[n_fail:]
    print(f"\nsoak CI {cfg}: {sum(r.requests for r in reports)} requests checked in {len(reports)} passing runs")
    if failures:
        pytest.fail(_failure_text(failures), pytrace=False)
    _check_routes(reports, str(cfg))


def test_soak_ci_covers_every_phase(soak):
    """The CI runs aimed cancels at every phase and really ran under pressure."""
    ran = {r.cfg for r in soak.reports}
    if not set(CI_CONFIGS) <= ran:
        pytest.skip("needs every CI configuration to have passed in this session")
    cancels = collections.Counter()
    for r in soak.reports:
        cancels.update(r.cancelled)
    missing = [p for p in PHASES if not cancels[p]]
    assert not missing, (f"harness coverage (not an engine bug): no cancel landed while {missing}; cancels by phase "
                         f"{dict(cancels)}; tune CI_SEEDS / Run.P_CANCEL")


def test_soak_budget(soak, request):
    """--budget=SECONDS: the CI configurations with more seeds, then random configurations near
    the lower bounds, until the budget is spent (engine warm-ups included)."""
    budget = request.config.getoption("--budget")
    if not budget:
        pytest.skip("the long soak runs with --budget=SECONDS")
    deadline = time.monotonic() + budget
    n_rep, n_fail = len(soak.reports), len(soak.failures)
    cfg_index = 0
    while time.monotonic() < deadline:
        cfg = (CI_CONFIGS[cfg_index] if cfg_index < len(CI_CONFIGS)
               else random_config(random.Random(7919 * cfg_index)))
        for j in range(BUDGET_SEEDS_PER_CONFIG):
            if time.monotonic() >= deadline:
                break
            soak.run(cfg, 1000 * (cfg_index + 1) + j, BUDGET_REQUESTS)
        cfg_index += 1
    reports, failures = soak.reports[n_rep:], soak.failures[n_fail:]
    print(f"\nsoak budget {budget:.0f}s: {len(reports) + len(failures)} runs over {cfg_index} configurations, "
          f"{sum(r.requests for r in reports)} requests checked in passing runs")
    if failures:
        pytest.fail(_failure_text(failures), pytrace=False)
    _check_routes(reports, f"--budget={budget:.0f}")


REGRESSIONS = os.path.join(os.path.dirname(__file__), "..", "fixtures", "soak")


@pytest.mark.parametrize("name", sorted(f for f in (os.listdir(REGRESSIONS) if os.path.isdir(REGRESSIONS) else ())
                                         if f.endswith(".json")))
def test_soak_regressions_replay_clean(soak, tiny_model, name):
    """Schedules a soak once failed on, replayed exactly (tests/fixtures/soak/): e.g. a paused
    request with nothing resident got a spurious capacity error (RES-6) because the reclamation
    quote's cheap demotions blocked the one deletion that closed the Main KV gap (RCL-1)."""
    with open(os.path.join(REGRESSIONS, name)) as f:
        doc = json.load(f)
    cfg = SoakConfig.parse(doc["config"])
    report = replay(tiny_model, cfg, doc["schedule"], prior=doc.get("prior") or [], oracle=soak.oracle(cfg.ctx),
                    origin=os.path.join(REGRESSIONS, name))
    assert report.requests > 0
