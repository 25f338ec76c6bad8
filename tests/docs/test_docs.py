"""The docs stand on their own (no JAX, a second or two).

* every rule id the code, the tests or the docs cite is defined on docs/rules.md;
* no doc names a path outside the repository (a team folder, this machine's home, ...);
* every relative markdown link resolves to a file of the repository (and an anchor, if given,
  to a heading of that file);
* every docs page and the README link to docs/rules.md.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "rules.md"
THIS = Path(__file__).resolve()

# The rule families, explicitly: an id is FAMILY-NUMBER[letter]. A closed list keeps out
# look-alikes such as UTF-8, SHA-256, bench or flag names.
FAMILIES = ("G", "CFG", "RES", "REC", "CKP", "SH", "SAVE", "BIND", "SRC", "WAIT", "HEAT", "RCL",
            "HOST", "SCH", "PAUSE", "TXN", "OBS", "RD", "SCN")
_FAM = "|".join(FAMILIES)
# One citation: RES-3, REC-6a, and compounds RES-1..5 (range), BIND-1/2/5 (list), TXN-2–3.
_CITE = re.compile(rf"\b({_FAM})-(\d+[a-z]?)((?:(?:\.\.|/|–)\d+[a-z]?\b)*)")
# A comma list of bare numbers after an id ("SCN-2, 3, 4, 6"): only with at least two more
# numbers, so that prose such as "RES-6, 2 pages" is not read as a list.
_COMMA_LIST = re.compile(rf"\b({_FAM})-(\d+[a-z]?)((?:, ?\d+[a-z]?\b){{2,}})")
_WHOLE_FAMILY = re.compile(rf"\b({_FAM})-\*")
# A test that proves a rule carries its id in its name: test_rcl4_..., test_rec6a_...
_TEST_NAME = re.compile(rf"\btest_({_FAM.lower()})(\d+[a-z]?)_")
# Definitions on rules.md: a heading "### RES-3" or a list item "- **RES-3**".
_DEFINITION = re.compile(rf"^(?:#{{2,4}} +({_FAM})-(\d+[a-z]?) *$|- \*\*({_FAM})-(\d+[a-z]?)\*\*)", re.M)

CODE_DIRS = ("ninfer_jax", "ledger", "server", "pallas_kernels", "scripts", "tests")
CODE_SUFFIXES = (".py", ".proto", ".sh", ".jinja", ".toml", ".cfg")


def _docs() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BUILD.md", *sorted((ROOT / "docs").glob("*.md"))]


def _code_files() -> list[Path]:
    out = []
    for d in CODE_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in CODE_SUFFIXES and p.resolve() != THIS and "__pycache__" not in p.parts:
                out.append(p)
    return out


def _number(n: str) -> int:
    return int(re.match(r"\d+", n).group())


def cited_ids(text: str) -> set[str]:
    """Every rule id a text cites, compounds expanded (RES-1..3 -> RES-1, RES-2, RES-3)."""
    ids: set[str] = set()
    for m in _CITE.finditer(text):
        fam, first, rest = m.groups()
        ids.add(f"{fam}-{first}")
        prev = first
        for sep, num in re.findall(r"(\.\.|/|–)(\d+[a-z]?)", rest):
            if sep == "/":
                ids.add(f"{fam}-{num}")
            else:
                lo, hi = _number(prev), _number(num)
                assert lo <= hi <= lo + 40, f"odd range {m.group(0)!r}"
                ids.update(f"{fam}-{i}" for i in range(lo, hi + 1))
                ids.add(f"{fam}-{num}")  # keeps a letter suffix at the end of a range
            prev = num
    for m in _COMMA_LIST.finditer(text):
        fam, _first, rest = m.groups()
        ids.update(f"{fam}-{n}" for n in re.findall(r"\d+[a-z]?", rest))
    for m in _TEST_NAME.finditer(text):
        ids.add(f"{m.group(1).upper()}-{m.group(2)}")
    return ids


def defined_ids() -> list[str]:
    text = RULES.read_text(encoding="utf-8")
    return [f"{m[0] or m[2]}-{m[1] or m[3]}" for m in _DEFINITION.findall(text)]


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_cited_ids_parse_compounds():
    assert cited_ids("RES-3 and REC-6a") == {"RES-3", "REC-6a"}
    assert cited_ids("(RD-1..3, TXN-2/3)") == {"RD-1", "RD-2", "RD-3", "TXN-2", "TXN-3"}
    assert cited_ids("BIND-1/2/5; SCN-2, 3, 4, 6") == {"BIND-1", "BIND-2", "BIND-5", "SCN-2", "SCN-3", "SCN-4", "SCN-6"}
    assert cited_ids("RES-6, 2 pages") == {"RES-6"}
    assert cited_ids("def test_rec6a_probe(): UTF-8, SHA-256, XG-2, cfg6_min") == {"REC-6a"}


def test_rules_page_defines_each_id_once():
    ids = defined_ids()
    assert len(ids) > 100, "docs/rules.md: could not parse the definitions"
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    assert not dupes, f"docs/rules.md defines these ids twice: {dupes}"
    fams = {i.split("-")[0] for i in ids}
    assert fams == set(FAMILIES), f"families without a definition: {set(FAMILIES) - fams}"


def test_every_cited_rule_id_is_defined():
    defined = set(defined_ids())
    missing: dict[str, set[str]] = {}
    for p in _code_files() + _docs():
        text = p.read_text(encoding="utf-8", errors="replace")
        for i in cited_ids(text) - defined:
            missing.setdefault(i, set()).add(_rel(p))
        for fam in _WHOLE_FAMILY.findall(text):
            assert any(d.startswith(fam + "-") for d in defined), f"{_rel(p)}: {fam}-* names no defined family"
    assert not missing, "rule ids cited but not defined on docs/rules.md:\n" + "\n".join(
        f"  {i}: {', '.join(sorted(fs))}" for i, fs in sorted(missing.items()))


# --- paths outside the repository -------------------------------------------------------------

# This machine's and the team's folders; /tmp/ in example commands and a generic default such
# as ~/.cache/... are fine.
_OUTSIDE = re.compile(r"(?<![\w.])(?:/work/|/root/|/home/|/check/|/Users/)|shared/spec|\.\./shared")
_MD_NAME = re.compile(r"(?<![\w/.-])((?:\.\./|\./)?[\w./-]*\w\.md)\b")
_RELATIVE_UP = re.compile(r"(?<![\w.])((?:\.\./)+[\w./-]*)")


def _strip_code_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _exists(name: str, base: Path) -> bool:
    for d in (base, ROOT, ROOT / "docs"):
        p = (d / name).resolve()
        if p.is_relative_to(ROOT) and p.exists():
            return True
    return False


@pytest.mark.parametrize("doc", _docs(), ids=_rel)
def test_no_doc_names_a_path_outside_the_repository(doc):
    text = doc.read_text(encoding="utf-8")
    bad = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in _OUTSIDE.finditer(line):
            bad.append(f"{_rel(doc)}:{n}: {m.group(0)!r}")
        for m in _RELATIVE_UP.finditer(line):
            if not (doc.parent / m.group(1)).resolve().is_relative_to(ROOT):
                bad.append(f"{_rel(doc)}:{n}: {m.group(1)!r} leaves the repository")
        for m in _MD_NAME.finditer(line):  # DESIGN.md, spec/...: documents that are not here
            if not _exists(m.group(1), doc.parent):
                bad.append(f"{_rel(doc)}:{n}: {m.group(1)!r} is not a file of the repository")
    assert not bad, "\n".join(bad)


# --- links ----------------------------------------------------------------------------------

_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _slugs(md: Path) -> set[str]:
    """GitHub-style heading anchors of a markdown file."""
    out, seen = set(), {}
    for line in _strip_code_fences(md.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6} +(.*?) *#* *$", line)
        if not m:
            continue
        s = re.sub(r"[^\w\- ]", "", m.group(1).lower().replace("`", "")).replace(" ", "-")
        k = seen.get(s, 0)
        seen[s] = k + 1
        out.add(s if k == 0 else f"{s}-{k}")
    return out


def _links(doc: Path) -> list[str]:
    text = _strip_code_fences(doc.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)
    return _LINK.findall(text)


@pytest.mark.parametrize("doc", _docs(), ids=_rel)
def test_relative_links_resolve(doc):
    bad = []
    for target in _links(doc):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, frag = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.is_relative_to(ROOT) or not dest.exists():
            bad.append(f"{target}: no such file in the repository")
        elif frag and dest.suffix == ".md" and frag not in _slugs(dest):
            bad.append(f"{target}: no heading #{frag} in {_rel(dest)}")
    assert not bad, f"{_rel(doc)}:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("doc", [ROOT / "README.md"] + [p for p in sorted((ROOT / "docs").glob("*.md")) if p != RULES],
                         ids=_rel)
def test_every_page_links_to_the_rules(doc):
    want = "docs/rules.md" if doc.parent == ROOT else "rules.md"
    targets = [t.partition("#")[0] for t in _links(doc)]
    assert want in targets, f"{_rel(doc)} has no link to {want}"
