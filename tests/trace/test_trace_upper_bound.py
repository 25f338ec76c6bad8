"""The offline upper bound of reuse (`cache_replay.upper_bound`): for each request, the longest
prefix it shares with any earlier request's prompt + output (E, its last output token not yet
input). Checked against the definition, pair by pair, on random families with heavy sharing."""
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_jax.bench.cache_replay import upper_bound


def _by_definition(reqs):
    out, seen = [], []
    for r in reqs:
        toks = tuple(r["tokens"])
        best = 0
        for s in seen:
            n = 0
            while n < min(len(s), len(toks)) and s[n] == toks[n]:
                n += 1
            best = max(best, n)
        out.append(best)
        seen.append(toks + tuple(r["output"])[:-1])
    return out


_req = st.fixed_dictionaries({
    "cut": st.integers(0, 30),
    "tail": st.lists(st.integers(0, 2), min_size=1, max_size=8),
    "output": st.lists(st.integers(0, 2), max_size=5)})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=30, max_size=30), st.lists(_req, min_size=1, max_size=14))
def test_upper_bound_is_the_longest_shared_prefix_with_any_earlier_request(base, shapes):
    reqs = [{"tokens": base[:s["cut"]] + s["tail"], "output": s["output"]} for s in shapes]
    assert upper_bound(reqs) == _by_definition(reqs)


def test_a_retry_shares_its_whole_prompt_and_an_extension_its_predecessors_end():
    a = {"tokens": [5, 6, 7], "output": [8, 9]}
    retry = {"tokens": [5, 6, 7], "output": [1]}
    follow = {"tokens": [5, 6, 7, 8, 4], "output": [2]}
    assert upper_bound([a, retry, follow]) == [0, 3, 4]
