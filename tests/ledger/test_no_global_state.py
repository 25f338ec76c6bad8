"""The ledger keeps no process-global mutable state (issue 38): what it remembers between calls
belongs to a value its caller owns, so two engines in one process are independent.

* Two policy states driven side by side through the reclamation path the engine takes
  (ninfer_jax/engine/reuse.py, `ContextCache.reclaim`: `gap_order`, `quote_facts(state,
  cache).quote(...)` with the revoking re-quote, `plan_reclaim`, commit, the demotion run to its
  end) each keep their own victim-index memo (`VictimIndex.memo`: the wide holder sets, the
  demotion leads): one's reclamations and edits never add to, change or read the other's.
* Every module under ledger/ is scanned (`ast`) for module-level mutable objects — dict, list
  and set displays and comprehensions, calls of dict/list/set/defaultdict/OrderedDict/deque/
  Counter/... — in module bodies and class bodies, mutable default arguments and `global`
  rebinding; tuples, frozensets and `MappingProxyType` are fine. The loaded modules are checked
  at run time too (a table built by a helper call escapes the scan).
"""
from __future__ import annotations

import ast
import collections
import pathlib
import sys
import weakref

from cache_helpers import L, SavePoint, make, toks

LEDGER = pathlib.Path(L.__file__).parent
MUTABLE_CALLS = frozenset({"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "deque", "Counter",
                           "ChainMap", "WeakValueDictionary", "WeakKeyDictionary", "WeakSet", "array"})
MUTABLE_TYPES = (dict, list, set, bytearray, collections.deque, weakref.WeakValueDictionary,
                 weakref.WeakKeyDictionary, weakref.WeakSet)
ALLOWED_NAMES = frozenset({"__all__"})  # the export list (a list by convention), not state


# -- two engines in one process -------------------------------------------------------------------
def _family(sim, tag: int, n: int = 12):
    """n requests continuing one system prompt (a shared marker at its end, SH-1): more than
    `index.BIG` points list the prompt's pages, so the index derives wide holder sets."""
    system = toks(128, base=5000 + 1000 * tag)
    for i in range(n):
        t = system + [(7 * i) % 900 + 1] + toks(40, base=20_000 * tag + 100 * i)
        sim.run(f"e{tag}-{i}", t, [SavePoint(128, L.PointKind.SHARED), SavePoint(len(t))], output=(1, 2))


def _reclaim(sim, pools: dict, protect=()) -> int:
    """What the engine's `ContextCache.reclaim` does for a shortfall: pools in `gap_order`, one
    shared `quote_facts` per (state, cache), the revoking re-quote when ordinary reclamation is not
    enough, `plan_reclaim` committed, its demotion run to its end. Returns the reclamations made."""
    made = 0
    applicant = L.Applicant(L.ApplicantKind.NECESSARY)
    for pool in L.gap_order(pools):
        facts = L.quote_facts(sim.state, sim.cache)
        q = facts.quote(L.Gap(pool, pools[pool]), applicant, protect)
        if not q.admitted:
            q = facts.quote(L.Gap(pool, pools[pool]), applicant._replace(revoke_waiters=True), protect)
        if not q.admitted:
            continue
        got = L.plan_reclaim(sim.state, sim.cache, q)
        assert isinstance(got, L.CacheResult), got
        sim.apply(got)
        sim.drive_transaction()
        made += 1
    return made


def _snapshot(memo) -> tuple:
    return dict(memo.wide_sets), dict(memo.leads)


def _drive(sim, rounds: int = 4) -> int:
    made = 0
    for _ in range(rounds):
        made += _reclaim(sim, {L.MAIN_KV: 3, L.STATE_POOL: 1})
    return made


def test_two_engines_in_one_process_keep_their_own_reclamation_memo():
    one, other = make(main=256, slots=64, host=1 << 20), make(main=256, slots=64, host=1 << 20)
    _family(one, 1)
    _family(other, 2)
    memo_one, memo_other = one.cache.victims.memo, other.cache.victims.memo
    assert memo_one is not memo_other
    assert memo_one.wide_sets and memo_other.wide_sets, "both indexes derived wide holder sets"
    # the two caches number their points alike, so their holder sets are equal values: one table
    # for both would hand one engine's derivations to the other
    assert memo_one.wide_sets is not memo_other.wide_sets and memo_one.leads is not memo_other.leads

    for driven, idle, memo_driven, memo_idle in ((one, other, memo_one, memo_other),
                                                 (other, one, memo_other, memo_one)):
        idle_before, driven_before = _snapshot(memo_idle), _snapshot(memo_driven)
        assert _drive(driven) >= 2, "the shortfalls were met by reclamation"
        _family(driven, 3 if driven is one else 4, n=3)  # more edits on the driven engine's cache
        assert driven.cache.victims.memo is memo_driven  # a lineage of index versions keeps its memo
        assert _snapshot(memo_driven) != driven_before, "the driven engine's reclamation used its memo"
        assert _snapshot(memo_idle) == idle_before, "the other engine's memo did not move"
        assert all(a is b for a, b in zip(_snapshot(memo_idle)[0].values(), idle_before[0].values()))
        assert idle.cache.victims.memo is memo_idle
        L.check_cache(idle.state, idle.cache)  # still consistent with its own facts

    # no ledger module holds either memo or its tables
    tables = {id(t) for m in (memo_one, memo_other) for t in (m, m.wide_sets, m.leads)}
    for name, module in list(sys.modules.items()):
        if name == "ledger" or name.startswith("ledger."):
            held = [k for k, v in vars(module).items() if id(v) in tables]
            assert not held, f"{name} holds an engine's memo at module level: {held}"


# -- no module-level mutable objects ----------------------------------------------------------------
def _mutable(node) -> bool:
    if isinstance(node, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        return name in MUTABLE_CALLS
    return False


def _targets(stmt) -> list[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return [ast.unparse(t) for t in targets]


def _scope_findings(body, where: str) -> list[str]:
    """Mutable assignments in a module's or class's own body (and the if/try/with/for blocks in it)."""
    out = []
    for stmt in body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
            names = [n for n in _targets(stmt) if n not in ALLOWED_NAMES]
            if names and _mutable(stmt.value):
                out.append(f"{where}:{stmt.lineno}: {', '.join(names)} = {ast.unparse(stmt.value)[:60]}")
        elif isinstance(stmt, ast.ClassDef):
            out += _scope_findings(stmt.body, f"{where} class {stmt.name}")
        elif isinstance(stmt, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            blocks = [stmt.body, getattr(stmt, "orelse", []), getattr(stmt, "finalbody", [])]
            blocks += [h.body for h in getattr(stmt, "handlers", [])]
            for b in blocks:
                out += _scope_findings(b, where)
    return out


def mutable_module_state(path: pathlib.Path, where: str | None = None) -> list[str]:
    """What in this module's source is mutable state at module level, one line each."""
    where = where or str(path.relative_to(LEDGER.parent))
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = _scope_findings(tree.body, where)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            defaults = list(node.args.defaults) + [d for d in node.args.kw_defaults if d is not None]
            if any(_mutable(d) for d in defaults):
                out.append(f"{where}:{node.lineno}: a mutable default argument (shared by every call)")
        elif isinstance(node, ast.Global):
            out.append(f"{where}:{node.lineno}: global {', '.join(node.names)} (rebinds module state)")
    return out


def test_the_scan_names_what_it_forbids(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from collections import defaultdict\nfrom types import MappingProxyType\n"
                   "A = {}\nB: list = []\nC = defaultdict(list)\nD = (1, 2)\nE = frozenset()\n"
                   "F = MappingProxyType({1: 2})\n__all__ = ['D']\n"
                   "class K:\n    memo = {}\n    names = ('a',)\n"
                   "def f(x=[]):\n    global A\n")
    found = mutable_module_state(bad, "bad.py")
    assert len(found) == 6, found
    for want in ("bad.py:3: A = {}", "bad.py:4: B = []", "bad.py:5: C = defaultdict(list)", "bad.py class K:11: memo",
                 "bad.py:13: a mutable default argument", "bad.py:14: global A"):
        assert any(f.startswith(want) for f in found), (want, found)


def test_no_ledger_module_keeps_mutable_state_at_module_level():
    paths = sorted(LEDGER.rglob("*.py"))
    assert LEDGER / "reclamation" / "index.py" in paths  # the scan reaches the subpackages
    found = [f for p in paths if "__pycache__" not in p.parts for f in mutable_module_state(p)]
    assert not found, "module-level mutable state in ledger/ (memo tables belong to a value the caller " \
                      "owns):\n  " + "\n  ".join(found)


def test_no_loaded_ledger_module_holds_a_mutable_object():
    import ledger.reclamation  # noqa: F401  (every module of the package loaded)

    found = []
    for name, module in sorted(sys.modules.items()):
        if name != "ledger" and not name.startswith("ledger."):
            continue
        for key, value in vars(module).items():
            if key.startswith("__") or key in ALLOWED_NAMES:
                continue
            if isinstance(value, MUTABLE_TYPES):
                found.append(f"{name}.{key}: {type(value).__name__}")
    assert not found, "mutable objects at module level: " + ", ".join(found)
