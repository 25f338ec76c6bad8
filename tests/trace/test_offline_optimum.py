"""The offline optimum of `ninfer trace` (bench/offline_optimum.py), an upper bound of the reuse
any placement serves at the replay's pools: checked against brute force over every keep/evict
choice of a physical model of the pools on small traces, against the infinite-cache bound, and
against what the engine's own policy serves on the cost-model Program at C = 1."""
from __future__ import annotations

import functools
import random
from typing import NamedTuple

import pytest

from ninfer_jax import ContextCacheConfig, EngineConfig
from ninfer_jax.bench import trace as T
from ninfer_jax.bench import trace_gen
from ninfer_jax.bench.cache_replay import upper_bound
from ninfer_jax.bench.offline_optimum import OfflineRequest, capacities, offline_optimum, with_branch_points


# ---- brute force: a physical model of the pools, every keep/evict choice ---------------------------
class Checkpoint(NamedTuple):
    depth: int
    tokens: tuple
    state: tuple  # the StateImage object
    pages: tuple  # its own page objects covering [0, depth)


def _subsets(items):
    items = list(items)
    for mask in range(1 << len(items)):
        yield frozenset(x for i, x in enumerate(items) if mask >> i & 1)


def _objects(cps) -> tuple[set, set]:
    return {p for c in cps for p in c.pages}, {c.state for c in cps}


def brute_force(reqs: list[OfflineRequest], kv_pages: int, state_slots: int, page: int) -> int:
    """The most prompt tokens a placement serves, by enumeration. Objects are physical: request
    t binds a held checkpoint on its prompt (or none), shares its full pages and makes the rest of
    its pages and its live StateImage; while it runs its pages, the live slot and whatever is kept
    across it fit the pools; after it, any of its save points (saves and E) may be kept, with any
    subset of the checkpoints held before. (A checkpoint no later prompt can bind is never kept:
    keeping it serves nothing and only takes room.)"""
    ceil = lambda x: -(-x // page)  # noqa: E731

    def useful(c: Checkpoint, t: int) -> bool:
        return any(len(r.prompt) >= c.depth and tuple(r.prompt[:c.depth]) == c.tokens for r in reqs[t + 1:])

    @functools.cache
    def best(t: int, held: frozenset) -> int:
        if t == len(reqs):
            return 0
        r = reqs[t]
        prompt, seq = tuple(r.prompt), tuple(r.sequence())
        out = 0
        for src in [None] + [c for c in held if c.depth <= len(prompt) and prompt[:c.depth] == c.tokens]:
            f = src.depth if src else 0
            own = tuple(src.pages[j] if src and page * (j + 1) <= f else ("page", t, j) for j in range(ceil(len(seq))))
            new = [Checkpoint(d, seq[:d], ("state", t, d), own[:ceil(d)]) for d in sorted(r.save_depths())]
            new = [c for c in new if useful(c, t)]
            for kept in _subsets(c for c in held if useful(c, t)):
                pages, states = _objects(kept)
                if len(own) + len(pages - set(own)) > kv_pages or 1 + len(states) > state_slots:
                    continue
                for fresh in _subsets(new):
                    after = kept | fresh
                    pages, states = _objects(after)
                    if len(pages) <= kv_pages and len(states) <= state_slots:
                        out = max(out, f + best(t + 1, after))
        return out

    return best(0, frozenset())


def _tiny_trace(rng: random.Random, n: int) -> list[OfflineRequest]:
    """Prompts over a 2-letter alphabet that extend, cut or retry earlier sequences; random save
    points and short outputs."""
    made: list[tuple] = []
    reqs = []
    for _ in range(n):
        if made and rng.random() < 0.8:
            base = rng.choice(made)
            prompt = base[:rng.randint(1, len(base))] + tuple(rng.randrange(2) for _ in range(rng.randint(0, 3)))
        else:
            prompt = tuple(rng.randrange(2) for _ in range(rng.randint(2, 5)))
        prompt = prompt[:7] or (0,)
        output = tuple(rng.randrange(2) for _ in range(rng.randint(1, 2)))
        saves = tuple(sorted(rng.sample(range(1, len(prompt) + 1), rng.randint(1, min(2, len(prompt))))))
        reqs.append(OfflineRequest(prompt, output, saves=saves))
        made.append(prompt + output[:-1])
    return reqs


# ---- the bound against brute force ------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(60))
def test_the_bound_is_never_below_brute_force(seed):
    rng = random.Random(seed)
    reqs = _tiny_trace(rng, rng.randint(3, 5))
    page = rng.choice((2, 3))
    need = max(-(-len(r.sequence()) // page) for r in reqs)
    kv_pages, state_slots = need + rng.randint(0, 3), rng.randint(1, 3)
    exact = brute_force(reqs, kv_pages, state_slots, page)
    opt = offline_optimum(reqs, kv_pages=kv_pages, state_slots=state_slots, page_tokens=page)
    assert opt.tokens >= exact, (seed, opt, exact)
    assert opt.tokens <= opt.unbounded_tokens == brute_force(reqs, 99, 99, page)


def test_two_sessions_taking_turns_against_brute_force():
    """Sessions A and B take turns, A B A B, each turn extending the previous one's end E
    (depth 5, 3 pages of 2 tokens) and saving its prompt end R (depth 4, 2 pages). Keeping A's E
    across B's first turn takes 3 pages beside B's 3; keeping B's E across A's second, 3 beside
    A's 4 (B's R: 2). With 7 pages both Es fit, with 6 one E and one R, with one slot nothing (the
    live StateImage takes it): there the bound is exact. With 5 or 4 pages the LP keeps parts of
    hits: 6 and 2, above brute force's 4 and 0."""
    a, b = (0, 0, 0, 0), (1, 1, 1, 1)
    reqs = [OfflineRequest(a, (5, 0), saves=(4,)), OfflineRequest(b, (6, 0), saves=(4,)),
            OfflineRequest(a + (5, 7, 7), (9, 0), saves=(7,)), OfflineRequest(b + (6, 8, 8), (9, 0), saves=(7,))]
    for kv_pages, slots, exact, bound in ((7, 2, 10, 10), (6, 2, 9, 9), (7, 1, 0, 0), (5, 2, 4, 6), (4, 3, 0, 2)):
        assert brute_force(reqs, kv_pages, slots, 2) == exact
        assert offline_optimum(reqs, kv_pages=kv_pages, state_slots=slots, page_tokens=2).tokens == bound


def test_without_save_points_and_capacity_it_is_the_infinite_cache_bound():
    """Saves everywhere (saves=None) and room for everything: each request's longest prefix
    shared with an earlier prompt + output, `cache_replay.upper_bound`."""
    rng = random.Random(7)
    for _ in range(20):
        reqs = [OfflineRequest(r.prompt, r.output) for r in _tiny_trace(rng, 8)]
        opt = offline_optimum(reqs, kv_pages=10 ** 6, state_slots=10 ** 6, page_tokens=2)
        want = sum(upper_bound([{"tokens": list(r.prompt), "output": list(r.output)} for r in reqs]))
        assert opt.tokens == opt.unbounded_tokens == want and opt.method == "unbounded"


def test_branch_points_are_offered_where_a_prompt_leaves_every_earlier_one():
    """Raw and rendered prompts alike (engine/branch_points.py); none past a prompt's end."""
    first = OfflineRequest(tuple(range(200)), (1,), saves=(200,), raw=True)
    second = OfflineRequest(tuple(range(130)) + (7, 7), (1,), saves=(132,), raw=True)
    chat = OfflineRequest(tuple(range(130)), (1,), saves=(130,))
    inside = OfflineRequest(tuple(range(128)), (1,), saves=(128,))
    got = with_branch_points([first, second, chat, inside])
    assert got[0].saves == (200,) and got[1].saves == (128, 132) and got[2].saves == (128, 130)
    assert got[3].saves == (128,)  # its shared blocks end at its own end: nothing strictly inside


def test_capacities_count_the_host_arena_as_room_for_either_kind():
    pools = {"main_kv": {"units": 10, "unit_bytes": 4}, "state_slots": {"units": 2, "unit_bytes": 10},
             "host_arena_bytes": 40}
    assert capacities(pools) == (20, 6)


# ---- the engine never beats it ----------------------------------------------------------------------
def _engine_config(c: int = 1) -> EngineConfig:
    return EngineConfig(max_concurrency=c, chunk_size=128, progress=False,
                        context_cache=ContextCacheConfig(host_capacity_bytes=0))


@pytest.fixture(scope="module")
def small_traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("optimum")
    out = {}
    for kind, sessions in (("marconi", 6), ("agent", 6), ("chat", 6)):
        path = folder / f"{kind}.jsonl"
        trace_gen.write(trace_gen.generate(kind, sessions, seed=3), str(path))
        out[kind] = str(path)
    return out


@pytest.mark.parametrize("kind,budget", [("marconi", 500_000), ("marconi", 1_500_000), ("agent", 600_000),
                                         ("chat", 1_000_000)])
def test_the_engine_serves_no_more_than_the_bound(small_traces, kind, budget):
    """Six sessions at budgets where the pools run short (the LP binds): the engine's policy,
    token-level prompts with branch points and chat-level ones with rendered save points."""
    f = T.run_trace(small_traces[kind], _engine_config(), program="sim", cold=False, cache_device_bytes=budget)
    assert f["requests_failed"] == 0 and f["offline_optimum_method"] == "lp_dual"
    assert 0 < f["cached_tokens"] <= f["offline_optimum_tokens"] < f["upper_bound_tokens"]
    assert f["reuse_of_offline_optimum_pct"] == round(100 * f["cached_tokens"] / f["offline_optimum_tokens"], 1)


def test_it_is_reported_only_at_one_request_at_a_time(small_traces):
    f = T.run_trace(small_traces["marconi"], _engine_config(2), program="sim", cold=False,
                    cache_device_bytes=1_500_000)
    assert f["offline_optimum_tokens"] is None and f["reuse_of_offline_optimum_pct"] is None


def test_ninfer_trace_prints_it_beside_the_infinite_bound(capsys, small_traces):
    from trace_helpers import run_cli

    code, out, _ = run_cli(capsys, "trace", small_traces["marconi"], "--program=sim", "--max_concurrency=1",
                           "--cold=false", "--cache_device_bytes=1000000", "--host_capacity_bytes=0")
    lines = dict(line.split(None, 1) for line in out.splitlines() if line.strip())
    assert code == 0 and int(lines["cached_tokens"]) <= int(lines["offline_optimum_tokens"])
    assert int(lines["offline_optimum_tokens"]) <= int(lines["upper_bound_tokens"])
    assert lines["offline_optimum_method"] == "lp_dual" and 0 < float(lines["reuse_of_offline_optimum_pct"]) <= 100


def test_bench_optimum_rows_and_a_budget_that_cannot_start():
    from ninfer_jax.bench import optimum_bench

    f = optimum_bench.run(["--sessions=3", "--kinds=marconi", "--pcts=1,50"])
    small, half = f["rows"]
    assert not small["started"] and "cache_device_bytes" in small["refused"]
    assert half["started"] and half["cache_device_bytes"] == int(0.5 * half["working_set_bytes"])
    assert 0 < half["reuse_of_offline_optimum"] <= 1 and half["reuse_of_upper_bound"] <= half["optimum_of_upper_bound"]
    assert "cannot start" in optimum_bench.text(f) and f["worst_reuse_of_offline_optimum"] == half["reuse_of_offline_optimum"]
