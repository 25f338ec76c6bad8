"""The offline optimum of context reuse at one cache size: a proven upper bound (docs/trace.md).

`cache_replay.upper_bound` says what an unbounded cache could serve. This module says what any
policy could serve with the replay's own pools -- K StateImage slots and M Main KV pages, the
split of one byte budget -- on the requests as the engine saw them, one at a time (C = 1), so a
policy's reuse reads as a share of what was achievable. Pure Python and NumPy, plus the LP
solver SciPy ships (HiGHS; SciPy is a dependency of jax); no JAX.

**What a hit needs.** A hybrid resumes request t at frontier f only from a checkpoint at exactly
its prompt's first f tokens: a StateImage made where an earlier request offered a save point
(its `save_frontiers`, or its end E) and that checkpoint's own Main KV page objects of [0, f),
all held when t is admitted; t is then served f tokens. Full pages below f are shared with t,
the rest t makes itself (docs/cache_policy.md, Bind).

**The program.** One 0/1 variable y[t, f] per hit t could have (f: a frontier on t's prompt where
an earlier request saved); maximise sum f y with at most one hit per request, under what the
pools must hold while each request s runs (at C = 1 nobody else runs): its own
ceil(len(S_s)/64) pages (S_s = prompt + output[:-1]) and one live StateImage, and beside them
every object a later hit needs that was made before s and is not s's own:
    pages:  ceil(len(S_s)/64) + sum over hits (t, f), t > s, of #{j < ceil(f/64): q_j < s} y[t, f] <= M
    states: 1 + sum over hits (t, f) with a < s < t of y[t, f]                                    <= K
where a is the last request before t that saved at P_t[:f] or could have bound from it, and
q_j = max(a, the last request before t that reached the page's first token and could have bound
past it: only such a request can have that very page object as its own).
Sound: an object a hit uses was made no later than a (its checkpoint's save) and is resident
until t; in (a, t) and (q_j, t) it is not s's own (s would have saved it, bound it or could have,
putting a or q_j at s or later); two hits of one request are never both 1, and two of different
requests t1 < t2 never count one object at one time (t1 could bind it, so t2's interval starts
at t1 or later). So every engine run at these pools is a 0/1 point of the program with its
reuse as value. Where it is generous: save points count even where the engine skipped one
(no room) or bound past it, a prompt's branch point counts whatever it bound
(`with_branch_points`), captures made while s runs cost nothing, and a Host arena is counted as
room for either kind (`capacities`). A deeper f with the same pages and the same a is never
worse (same charges, more tokens): only the deepest of each is a variable.

**The figure.** The program's LP relaxation is solved by HiGHS; the figure is not the solver's
number but the Lagrangian dual at the LP's row prices lam, mu >= 0,
    UB = sum_s lam_s (M - pages(S_s)) + mu_s (K - 1)  +  sum_t max(0, max_f f - price(t, f)),
an upper bound of the LP's optimum, and so of the engine's reuse, for any lam, mu >= 0 (weak
duality), computed in float64 and rounded down with a 1e-3 margin. It is an upper bound, not
the exact optimum: the program's integer optimum may lie below it (by at most 0.7 % on the
`ninfer bench optimum` traces, by HiGHS's MILP), and the program itself is generous where
listed above. `tests/trace/test_offline_optimum.py` checks it against brute force over every
keep/evict choice on small traces, and against the engine.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

PAGE_TOKENS = 64  # Main KV page, tokens (ledger.PAGE_TOKENS)


@dataclasses.dataclass(frozen=True)
class OfflineRequest:
    """One request as the engine saw it. `saves`: the prompt frontiers it offered the cache
    (`Completion.save_frontiers`; its end E always counts besides), or None for every depth;
    `raw`: a pre-tokenised prompt (the engine may offer any prompt a branch point:
    `with_branch_points`); `ran`: it ran to an end that held all its pages and a live slot
    (a failed request is given no pressure: weaker, still a bound)."""

    prompt: Sequence[int]
    output: Sequence[int] = ()
    saves: Sequence[int] | None = None
    raw: bool = False
    ran: bool = True

    def sequence(self) -> Sequence[int]:
        """Its tokens with KV and state made: the prompt and the output but its last token."""
        return list(self.prompt) + list(self.output)[:-1]

    def save_depths(self) -> set[int] | None:
        """The depths of its sequence where it may leave a StateImage (None: any)."""
        if self.saves is None:
            return None
        return {f for f in self.saves if 0 < f <= len(self.prompt)} | {len(self.sequence())}


def with_branch_points(reqs: Sequence[OfflineRequest], page: int = PAGE_TOKENS) -> list[OfflineRequest]:
    """Each prompt's saves plus the branch point the engine may offer it at admission
    (engine/branch_points.py): the end of the longest run of whole 64-token blocks it shares
    with an earlier prompt, strictly inside it. The engine offers it only past the point it
    bound from (and a rendered prompt only below four shared markers), which depends on the
    cache; offering it always makes a superset of what any placement could have had."""
    root: dict = {}
    out = []
    for r in reqs:
        if r.saves is None:
            out.append(r)
            continue
        p, node, k = list(r.prompt), root, 0
        blocks = [tuple(p[i:i + page]) for i in range(0, len(p) - page + 1, page)]
        for b in blocks:
            node = node.get(b)
            if node is None:
                break
            k += 1
        extra = {k * page} if 0 < k * page < len(p) else set()
        out.append(dataclasses.replace(r, saves=tuple(sorted(set(r.saves) | extra))))
        node = root
        for b in blocks:
            node = node.setdefault(b, {})
    return out


@dataclasses.dataclass(frozen=True)
class Optimum:
    tokens: int  # the upper bound (floor of the certified dual value)
    dual_value: float  # UB(lam, mu) before rounding down
    lp_value: float | None  # the solver's own LP optimum (None when none was solved)
    unbounded_tokens: int  # no capacity: each request's deepest save point an earlier request made
    candidates: int  # hit variables of the LP
    seconds: float
    method: str  # "lp_dual" or "unbounded" (no capacity binds, or no LP solution)


@dataclasses.dataclass
class _Hits:
    """The candidate hits of every request, column by column."""

    t: list[int] = dataclasses.field(default_factory=list)
    f: list[int] = dataclasses.field(default_factory=list)
    a: list[int] = dataclasses.field(default_factory=list)  # the state's last availability before t
    pages: list[np.ndarray] = dataclasses.field(default_factory=list)  # q_j for j < ceil(f/64), ascending


def _candidates(reqs: Sequence[OfflineRequest], page: int) -> tuple[_Hits, list[int]]:
    """Walk a token trie of the sequences so far. A node keeps the last time a StateImage there
    was *available* (a request saved there, or could have bound from it) and, at a page's first
    token, the last time a request could have owned that page object (it reached that token and
    its deepest candidate hit lies past the page's start: a page is only ever shared by binding
    past its start). Returns the candidate hits and, per request, its deepest candidate
    frontier (0: none)."""
    root: list = [{}, -1, -1]  # children, state last available, page last owned
    hits, deepest = _Hits(), []
    for t, r in enumerate(reqs):
        node, avail, owned = root, [], []
        for tok in r.prompt:
            node = node[0].get(tok)
            if node is None:
                break
            avail.append(node[1])
            if len(avail) % page == 1 % page:  # a page's first token
                owned.append(node[2])
        depth, best = len(avail), 0
        for f in range(depth, 0, -1):  # the deepest f of each (pages needed, last availability) run
            a = avail[f - 1]
            if a < 0 or (f < depth and (f + page - 1) // page == (f + page) // page and avail[f] == a):
                continue
            best = max(best, f)
            hits.t.append(t)
            hits.f.append(f)
            hits.a.append(a)
            hits.pages.append(np.sort(np.maximum(a, np.asarray(owned[:(f + page - 1) // page], dtype=np.int64))))
        deepest.append(best)
        node, at = root, r.save_depths()
        for d, tok in enumerate(r.sequence(), 1):
            node = node[0].setdefault(tok, [{}, -1, -1])
            if at is None or d in at or (d <= depth and avail[d - 1] >= 0):
                node[1] = t  # a state it saved, or could have bound from
            if d <= best and d % page == 1 % page:
                node[2] = t  # a page it could have bound past the start of
    return hits, deepest


def _matrix(hits: _Hits, n: int):
    """The LP's rows as a sparse matrix: page rows 0..n-1, state rows n..2n-1, request rows
    2n..3n-1; one column per candidate hit."""
    from scipy.sparse import csc_matrix

    rows, cols, vals = [], [], []
    for c, (t, a, p) in enumerate(zip(hits.t, hits.a, hits.pages)):
        taus = np.arange(p[0] + 1, t, dtype=np.int64)  # pages kept across s: q_j < s < t
        if taus.size:
            rows.append(taus)
            vals.append(np.searchsorted(p, taus, side="left").astype(np.float64))
        states = np.arange(a + 1, t, dtype=np.int64)  # the state kept across s: a < s < t
        rows += [n + states, np.array([2 * n + t])]
        vals += [np.ones(states.size), np.ones(1)]
        cols.append(np.full(taus.size + states.size + 1, c, dtype=np.int64))
    if not cols:
        return csc_matrix((3 * n, 0))
    return csc_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(3 * n, len(hits.t)))


def _dual_value(a_ub, f: np.ndarray, t: np.ndarray, lam: np.ndarray, cap: np.ndarray, n: int) -> float:
    """UB(lam, mu): the capacity rows priced, each request's best candidate hit after its price
    (or none); any prices >= 0 give an upper bound of the LP and so of the program (weak
    duality)."""
    cost = a_ub[:2 * n].T @ lam[:2 * n]
    gain = np.zeros(n)
    np.maximum.at(gain, t, f - cost)
    return float(gain.sum() + lam[:2 * n] @ cap[:2 * n])


def offline_optimum(reqs: Sequence[OfflineRequest], *, kv_pages: int, state_slots: int,
                    page_tokens: int = PAGE_TOKENS, live_slots: int = 1) -> Optimum:
    """The most prompt tokens any placement could serve on `reqs` (in admission order, C = 1)
    with `kv_pages` Main KV pages and `state_slots` StateImage slots: an upper bound (module
    doc). `live_slots`: the StateImage slots a running request holds."""
    start = time.perf_counter()
    n = len(reqs)
    hits, deepest = _candidates(reqs, page_tokens)
    unbounded = sum(deepest)
    if not hits.t:
        return Optimum(0, 0.0, None, 0, 0, time.perf_counter() - start, "unbounded")
    pressure = np.array([-(-len(r.sequence()) // page_tokens) if r.ran else 0 for r in reqs])
    cap = np.concatenate([np.maximum(0, kv_pages - pressure),
                          np.array([max(0, state_slots - live_slots) if r.ran else state_slots for r in reqs]),
                          np.ones(n)]).astype(np.float64)
    a_ub = _matrix(hits, n)
    f, t = np.asarray(hits.f, dtype=np.float64), np.asarray(hits.t, dtype=np.int64)
    value, lp, method = float(unbounded), None, "unbounded"
    if (a_ub[:2 * n] @ np.ones(len(f)) > cap[:2 * n]).any():  # some capacity can bind
        from scipy.optimize import linprog

        res = linprog(-f, A_ub=a_ub.tocsr(), b_ub=cap, bounds=(0, None), method="highs")
        if res.status == 0:
            lam = np.maximum(0.0, -np.asarray(res.ineqlin.marginals))
            value, lp, method = min(value, _dual_value(a_ub, f, t, lam, cap, n)), -float(res.fun), "lp_dual"
    tokens = int(np.floor(value + 1e-3))
    return Optimum(tokens, value, lp, unbounded, len(f), time.perf_counter() - start, method)


def capacities(pools: dict) -> tuple[int, int]:
    """(Main KV pages, StateImage slots) the bound may use from a replay's `pools` figure: each
    Device pool's units plus the Host arena's bytes over that pool's unit bytes (the arena
    counted as room for either kind, a weaker bound)."""
    host = pools.get("host_arena_bytes", 0) or 0

    def room(pid):
        p = pools[pid]
        return p["units"] + host // max(1, p["unit_bytes"])

    return room("main_kv"), room("state_slots")
