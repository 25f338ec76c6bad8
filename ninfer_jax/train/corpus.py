"""An English training corpus that ships with Python itself: nothing is downloaded.

Two sources, both fixed by the Python installation:
- `pydoc_data.topics`: the language reference's help topics (prose, one document per topic);
- the docstrings of the standard library: every `.py` file under the stdlib folder is *parsed*
  with `ast`, never imported, so no module runs (no prints, windows, sockets or platform
  checks, nothing to time out); the C-implemented modules in `_BUILTIN_MODULES` (always present,
  no import side effects) add their docstrings through `inspect`. One document per module.

Cleaning is light: doctest blocks, heading underlines and reST roles go, blank runs collapse,
docstrings seen before (inherited copies, `_pydecimal` vs `decimal`) are dropped. Documents are
ordered by id, and each goes to the held-out split by a hash of (split seed, id): the split of a
document does not depend on which other documents exist. The corpus is identical for one
Python installation; another Python version gives other text (`Corpus.digest` tells them apart).

Size on CPython 3.11.7: 581 training + 16 held-out documents, 2,333,399 + 95,692 characters,
912,780 + 37,413 tokens with the retrained 1024-id tokenizer (about 2.6 characters a token);
`load()` takes about 7 s (parsing some 730 files).
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import inspect
import os
import re
import sysconfig
from typing import Iterable, Iterator

SPLIT_SEED = 16  # fixed, so held-out figures compare across training seeds
HELDOUT_FRACTION = 0.03
MIN_ENTRY_CHARS = 16
MIN_DOC_CHARS = 64

# Folders under the stdlib that are not English documentation of the library: tests, third-party
# packages, codec tables (hundreds of generated near-identical docstrings), the help topics
# (read directly, below), demos.
_DENY_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test",
                        "encodings", "pydoc_data", "turtledemo", "config-3.11", "lib-dynload"})
# Files whose text is not English prose: `this` is ROT13, `antigravity` opens a browser (never
# imported here anyway, but it holds no documentation).
_DENY_FILES = frozenset({"this.py", "antigravity.py", "__phello__.foo.py"})
# C modules: present in every CPython build, importing them does nothing observable.
_BUILTIN_MODULES = ("builtins", "math", "cmath", "itertools", "gc", "sys", "time", "array", "binascii",
                    "_collections", "_functools", "_io", "_json", "_random", "_struct")

_UNDERLINE = re.compile(r"^\s*([*=~^\-#+])\1{2,}\s*$")
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`]*)`")
_LITERAL = re.compile(r"``([^`\n]+)``")
_BLANKS = re.compile(r"\n{3,}")


@dataclasses.dataclass(frozen=True)
class Document:
    id: str  # "topic:<name>", "module:<relative path>" or "builtin:<module>"
    text: str


@dataclasses.dataclass(frozen=True)
class Corpus:
    train: tuple[Document, ...]
    heldout: tuple[Document, ...]

    @property
    def chars(self) -> tuple[int, int]:
        return sum(len(d.text) for d in self.train), sum(len(d.text) for d in self.heldout)

    @property
    def digest(self) -> str:
        """sha256 over every document (id, split and text): names the exact corpus."""
        h = hashlib.sha256()
        for split, docs in (("train", self.train), ("heldout", self.heldout)):
            for d in docs:
                h.update(f"{split}\0{d.id}\0{d.text}\0".encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def describe(self) -> str:
        train, held = self.chars
        return (f"corpus {len(self.train)} + {len(self.heldout)} held-out documents, "
                f"{train:,} + {held:,} characters, sha256 {self.digest[:12]}")


def clean(text: str) -> str:
    """Light cleaning: no doctest blocks (prompt lines and their output), no heading underlines,
    reST roles reduced to their text, ``literals`` quoted as the help topics quote them, hard-wrapped prose paragraphs joined into one line (so
    a line break means a paragraph, list item or code line, not the column limit), trailing
    spaces and blank runs removed."""
    out: list[str] = []
    in_doctest = False
    for line in text.expandtabs(4).replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        stripped = line.strip()
        if stripped.startswith(">>>"):
            in_doctest = True
        if in_doctest:
            if not stripped:
                in_doctest = False
                out.append("")
            continue
        if _UNDERLINE.match(line):
            continue
        out.append(_LITERAL.sub(r'"\1"', _ROLE.sub(r"\1", line.rstrip())))
    blocks = _BLANKS.sub("\n\n", "\n".join(out)).strip().split("\n\n")
    return "\n\n".join(_unwrap(b) for b in blocks)


_LIST_ITEM = re.compile(r"^([-*+•]|\d+[.)]|[a-z][.)]|:\w+)\s")


def _unwrap(block: str) -> str:
    """A paragraph of unindented prose lines → one line; anything else (indented code or
    grammar, lists, fields) unchanged."""
    lines = block.split("\n")
    if len(lines) < 2:
        return block
    if any(line[:1].isspace() or _LIST_ITEM.match(line) for line in lines):
        return block
    return _SPACES.sub(" ", " ".join(line.strip() for line in lines))


_SPACES = re.compile(r"  +")


# ---- sources ----------------------------------------------------------------------------

def _topic_documents() -> Iterator[Document]:
    from pydoc_data import topics  # a data module: a dict of strings

    for name in sorted(topics.topics):
        yield Document(f"topic:{name}", topics.topics[name])


def _ast_entries(tree: ast.Module, module: str) -> Iterator[tuple[str, str]]:
    """(heading, docstring) of the module, then its classes and functions in source order."""
    doc = ast.get_docstring(tree)
    if doc:
        yield module, doc

    def walk(body: list, prefix: str) -> Iterator[tuple[str, str]]:
        for node in body:
            if isinstance(node, ast.ClassDef):
                doc = ast.get_docstring(node)
                if doc:
                    yield f"{prefix}{node.name}", doc
                yield from walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    yield f"{prefix}{node.name}", doc

    yield from walk(tree.body, f"{module}.")


def stdlib_files(root: str | None = None) -> list[tuple[str, str]]:
    """(relative path, absolute path) of the stdlib's `.py` files outside the deny-lists, sorted."""
    root = root or sysconfig.get_paths()["stdlib"]
    found: list[tuple[str, str]] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _DENY_DIRS and not d.startswith(("test", "config-"))]
        for name in files:
            if name.endswith(".py") and name not in _DENY_FILES and not name.startswith("test_"):
                path = os.path.join(folder, name)
                found.append((os.path.relpath(path, root).replace(os.sep, "/"), path))
    return sorted(found)


def _module_name(rel: str) -> str:
    name = rel[:-3].replace("/", ".")
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _source_documents(files: Iterable[tuple[str, str]]) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    for rel, path in files:
        try:
            with open(path, "rb") as f:
                tree = ast.parse(f.read(), filename=rel)
        except (SyntaxError, ValueError, OSError, UnicodeDecodeError):
            continue  # e.g. a lib2to3 fixture written in Python 2
        yield f"module:{rel}", list(_ast_entries(tree, _module_name(rel)))


def _builtin_documents() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    for name in _BUILTIN_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        entries = [(name, inspect.getdoc(module) or "")]
        for attr in sorted(vars(module)):
            obj = vars(module)[attr]
            if name == "sys" and f"__{attr}__" in vars(module):
                # sys keeps its original hooks as __excepthook__ etc.: a test runner or a debugger
                # replaces sys.excepthook / unraisablehook, and the corpus must not depend on that
                obj = vars(module)[f"__{attr}__"]
            if attr.startswith("__") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
                continue
            entries.append((f"{name}.{attr}", getattr(obj, "__doc__", None) or ""))
            if inspect.isclass(obj):
                for meth in sorted(vars(obj)):
                    member = vars(obj)[meth]
                    doc = getattr(member, "__doc__", None)
                    if not meth.startswith("__") and isinstance(doc, str):
                        entries.append((f"{name}.{attr}.{meth}", doc))
        yield f"builtin:{name}", [(h, inspect.cleandoc(d)) for h, d in entries if isinstance(d, str) and d]


def documents(max_files: int | None = None) -> list[Document]:
    """Every document in id order. `max_files` keeps only the first stdlib files (tests: a
    small, fast slice; the help topics and built-in modules are always all there)."""
    docs = [Document(d.id, clean(d.text)) for d in _topic_documents()]
    seen: set[str] = set()
    files = stdlib_files()
    grouped = list(_builtin_documents()) + list(_source_documents(files[:max_files] if max_files else files))
    for doc_id, entries in grouped:
        parts = []
        for heading, doc in entries:
            text = clean(doc)
            if len(text) < MIN_ENTRY_CHARS or text in seen:
                continue
            seen.add(text)
            parts.append(f"{heading}\n{text}")
        body = "\n\n".join(parts)
        if len(body) >= MIN_DOC_CHARS:
            docs.append(Document(doc_id, body))
    docs = [d for d in docs if len(d.text) >= MIN_DOC_CHARS]
    return sorted(docs, key=lambda d: d.id)


def is_heldout(doc_id: str, seed: int = SPLIT_SEED, fraction: float = HELDOUT_FRACTION) -> bool:
    digest = hashlib.sha256(f"{seed}:{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2 ** 64


def load(max_files: int | None = None, seed: int = SPLIT_SEED, fraction: float = HELDOUT_FRACTION) -> Corpus:
    """The corpus split into training and held-out documents (by document, never inside one)."""
    docs = documents(max_files)
    held = tuple(d for d in docs if is_heldout(d.id, seed, fraction))
    return Corpus(train=tuple(d for d in docs if not is_heldout(d.id, seed, fraction)), heldout=held)
