"""docs/rules.md agrees with the rule ids the production code cites (no JAX, a second or two).

A rule's "*Code:*" line on docs/rules.md names the modules that cite its id. Production code is
every source file under ninfer_jax/, ledger/, server/, pallas_kernels/ and scripts/ (tests/ have
their own "*Tests:*" part); a citation is what tests/docs/test_docs.py's `cited_ids` reads
(`RES-3`, `RES-1..5`, `BIND-1/2/5`, ...). The checks:

* every id a production module cites has its own `### ID` section with a "*Code:*" line;
* every (id, module) citation appears on that rule's Code line, and the Code line names no
  module that does not cite the id (a module that applies a rule without naming it belongs on a
  "*Not cited by id; applied in*" line, and such a rule is cited by no production module);
* every test module (a `test_*.py` under tests/, outside tests/docs/) that cites an id is named
  on that rule's "*Tests:*" line; helper modules (conftest.py, `*_checks.py`, `soak.py`, ...)
  may be named but need not be: their citations are notes on fixtures or on checks that the
  `test_*.py` modules using them cite and list as well, and tests/docs/ cites ids only as
  examples for the citation parser;
* every repository path a Code, applied-in or Tests line names exists;
* docs/ledger.md names every module under ledger/, and the pages this issue rewrote
  (architecture, ledger, trace, rules) name only repository paths that exist.

A failure lists what to change; the Code line is the sorted list of citing modules, with a short
note in parentheses after a module where one helps.
"""
from __future__ import annotations

import re
from pathlib import Path

from test_docs import CODE_SUFFIXES, ROOT, RULES, cited_ids

PRODUCTION = ("ninfer_jax", "ledger", "server", "pallas_kernels", "scripts")
TOP = ("ninfer_jax", "ledger", "server", "pallas_kernels", "scripts", "tests", "docs")
# a backticked repository path: `ledger/bind.py`, `ninfer_jax/plan/`, `tests/docs/test_docs.py`
_PATH = re.compile(rf"`((?:{'|'.join(TOP)})/[\w./-]*)`")
_SECTION = re.compile(r"^### +([A-Z]+-\d+[a-z]?) *$", re.M)
_CODE = re.compile(r"^\*Code:\*(.*?)(?: — \*Tests:\*.*)?$", re.M)
_APPLIED = re.compile(r"^\*Not cited by id[^*]*\*(.*)$", re.M)
_TESTS = re.compile(r"\*Tests:\*(.*)$", re.M)
# pages whose every backticked path must exist (the others mention history and examples)
CHECKED_PAGES = ("architecture.md", "ledger.md", "trace.md", "rules.md")


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def production_citations() -> dict[str, set[str]]:
    """rule id -> the production modules citing it."""
    out: dict[str, set[str]] = {}
    for d in PRODUCTION:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts:
                for i in cited_ids(p.read_text(encoding="utf-8", errors="replace")):
                    out.setdefault(i, set()).add(_rel(p))
    return out


def citing_test_modules() -> dict[str, set[str]]:
    """rule id -> the test modules (`test_*.py` under tests/, tests/docs/ left out) citing it."""
    out: dict[str, set[str]] = {}
    for p in sorted((ROOT / "tests").rglob("test_*.py")):
        rel = _rel(p)
        if rel.startswith("tests/docs/") or "__pycache__" in p.parts:
            continue
        for i in cited_ids(p.read_text(encoding="utf-8", errors="replace")):
            out.setdefault(i, set()).add(rel)
    return out


def rule_sections(text: str | None = None) -> dict[str, str]:
    """rule id -> its section's text (heading to the next heading) on docs/rules.md."""
    text = RULES.read_text(encoding="utf-8") if text is None else text
    heads = list(_SECTION.finditer(text))
    out = {}
    for m, nxt in zip(heads, heads[1:] + [None]):
        end = nxt.start() if nxt else len(text)
        body = text[m.end():end]
        out[m.group(1)] = re.split(r"^#{1,3} ", body, flags=re.M)[0]
    return out


def code_modules(section: str) -> set[str] | None:
    """The paths a section's "*Code:*" line names (None: the section has no Code line)."""
    m = _CODE.search(section)
    return None if m is None else set(_PATH.findall(m.group(1)))


def applied_modules(section: str) -> set[str] | None:
    m = _APPLIED.search(section)
    return None if m is None else set(_PATH.findall(m.group(1)))


def listed_tests(section: str) -> set[str] | None:
    """The paths a section's "*Tests:*" line names (None: the section has no Tests line)."""
    found = [set(_PATH.findall(m.group(1))) for m in _TESTS.finditer(section)]
    return set().union(*found) if found else None


def test_the_parsers_read_the_forms_rules_md_uses():
    res, g = "RES", "G"  # made-up ids, spelt so that the citation scan of this file skips them
    sample = (f"### {res}-99\nText.\n\n*Code:* `ledger/a.py`, `ninfer_jax/b.py` (the `_x` helper) — "
              f"*Tests:* `tests/t.py`.\n\n### {g}-99\nMore.\n\n*Not cited by id; applied in* `ledger/c.py`.\n"
              "\n## X — next family\n")
    sections = rule_sections(sample)
    one, two = f"{res}-99", f"{g}-99"
    assert set(sections) == {one, two}
    assert code_modules(sections[one]) == {"ledger/a.py", "ninfer_jax/b.py"}
    assert code_modules(sections[two]) is None and applied_modules(sections[two]) == {"ledger/c.py"}
    assert "next family" not in sections[two]
    assert listed_tests(sections[one]) == {"tests/t.py"} and listed_tests(sections[two]) is None
    cited = production_citations()
    assert len(cited) > 100 and sum(map(len, cited.values())) > 400, "could not read the citations"
    assert len(rule_sections()) > 120, "could not read docs/rules.md's sections"
    tested = citing_test_modules()
    assert len(tested) > 100 and sum(map(len, tested.values())) > 200, "could not read the tests' citations"


def test_every_rule_cited_in_production_code_has_a_code_line():
    sections = rule_sections()
    cited = production_citations()
    bad = []
    for rid, modules in sorted(cited.items()):
        if rid not in sections:
            bad.append(f"{rid}: cited by {', '.join(sorted(modules))}, but docs/rules.md has no '### {rid}'")
        elif code_modules(sections[rid]) is None:
            bad.append(f"{rid}: cited by {', '.join(sorted(modules))}, but its section has no '*Code:*' line")
    assert not bad, "\n".join(bad)


def test_code_lines_name_the_citing_modules_exactly():
    sections = rule_sections()
    cited = production_citations()
    bad = []
    for rid, section in sections.items():
        listed = code_modules(section)
        if listed is None:
            continue
        citing = cited.get(rid, set())
        if listed != citing:
            lost, stale = sorted(citing - listed), sorted(listed - citing)
            want = ", ".join(f"`{m}`" for m in sorted(citing)) or "(no production module cites it)"
            bad.append(f"{rid}: missing {lost or '-'}; not citing {stale or '-'}\n      *Code:* {want}")
    assert not bad, (f"{len(bad)} rules whose '*Code:*' line on docs/rules.md differs from the modules "
                     f"citing them:\n  " + "\n  ".join(bad))


def test_rules_applied_without_their_id_are_not_cited():
    sections = rule_sections()
    cited = production_citations()
    bad = [f"{rid}: '*Not cited by id*', yet cited by {', '.join(sorted(cited[rid]))} (give it a Code line)"
           for rid, s in sections.items() if applied_modules(s) is not None and rid in cited]
    assert not bad, "\n".join(bad)


def test_tests_lines_name_the_citing_test_modules():
    sections = rule_sections()
    bad = []
    for rid, modules in sorted(citing_test_modules().items()):
        if rid not in sections:
            bad.append(f"{rid}: cited by {', '.join(sorted(modules))}, but docs/rules.md has no '### {rid}'")
            continue
        lost = sorted(modules - (listed_tests(sections[rid]) or set()))
        if lost:
            bad.append(f"{rid}: add " + ", ".join(f"`{m}`" for m in lost))
    assert not bad, (f"{len(bad)} rules whose '*Tests:*' line on docs/rules.md lacks test modules citing "
                     f"them (append ' — *Tests:* ...' to the Code line where a rule has none):\n  "
                     + "\n  ".join(bad))


def test_rule_lines_name_existing_files():
    bad = []
    for rid, section in rule_sections().items():
        named = set()
        for pattern in (_CODE, _APPLIED, _TESTS):
            for m in pattern.finditer(section):
                named |= set(_PATH.findall(m.group(1)))
        bad += [f"{rid}: {p}" for p in sorted(named) if not (ROOT / p).exists()]
    assert not bad, "docs/rules.md names files that do not exist:\n  " + "\n  ".join(bad)


def test_checked_pages_name_existing_paths():
    bad = []
    for name in CHECKED_PAGES:
        page = ROOT / "docs" / name
        if not page.exists():
            bad.append(f"docs/{name}: missing")
            continue
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for p in _PATH.findall(line):
                if not (ROOT / p.split("::")[0]).exists():
                    bad.append(f"docs/{name}:{n}: {p}")
    assert not bad, "paths that are not in the repository:\n  " + "\n  ".join(bad)


def test_ledger_page_names_every_ledger_module():
    text = (ROOT / "docs" / "ledger.md").read_text(encoding="utf-8")
    named = set(_PATH.findall(text))
    modules = [_rel(p) for p in sorted((ROOT / "ledger").rglob("*.py")) if "__pycache__" not in p.parts]
    missing = [m for m in modules if m not in named]
    assert not missing, "docs/ledger.md does not describe:\n  " + "\n  ".join(missing)


# --- docs/architecture.md's structural measures ------------------------------------------------

_MEASURE_ROWS = {  # the table's first column -> the script's figure
    "import cycles among production modules": lambda m: m["import_cycles"],
    "upward imports (file edges)": lambda m: m["upward_imports"],
    "production modules over 600 lines": lambda m: len(m["modules_over_600_lines"]),
    "`ledger/reclamation/` modules over 400 lines": lambda m: len(m["reclamation_over_400_lines"]),
    "module-level mutable objects in `ledger/`": lambda m: len(m["ledger_module_level_mutable"]),
    "`obj._private` accesses across engine collaborators": lambda m: len(m["engine_private_accesses"]),
}


def test_architecture_states_the_current_measures():
    from structure_measures import measures

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    stated = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0] in _MEASURE_ROWS:
            stated[cells[0]] = cells[1]
    assert set(stated) == set(_MEASURE_ROWS), f"docs/architecture.md's measures table lacks {set(_MEASURE_ROWS) - set(stated)}"
    m = measures(ROOT)
    wrong = [f"{name}: the page says {stated[name]}, the script measures {figure(m)}"
             for name, figure in _MEASURE_ROWS.items() if stated[name] != str(figure(m))]
    assert not wrong, ("docs/architecture.md's 'now' column differs from "
                       "`python tests/docs/structure_measures.py`:\n  " + "\n  ".join(wrong))
