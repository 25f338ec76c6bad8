"""The production code's static import graph: no cycle, no upward arrow, no oversized module.

The layers import downward only:

    server  ->  ninfer_jax  ->  {ledger, pallas_kernels}

The graph is read from the source with `ast` (nothing is imported): every `import` and `from ...
import` of the packages below, at module level, inside functions or under `if TYPE_CHECKING:`
alike, and `importlib.import_module` / `__import__` of a string literal. An import's target is
the module it loads: `from a.b import c` is an edge to `a/b/c.py` when that is a module, else to
`a/b` (its `__init__.py`); the packages above the target, whose `__init__.py` runs first, are
not edges of their own. tests/ and scripts/ are not production code and are not read.

Sizes: no production module over 600 lines; none over 400 in the reclamation package
(`ledger/reclamation/`, once it exists).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ninfer_jax", "ledger", "server", "pallas_kernels")
# A package may import itself and the packages below it, never one above.
MAY_IMPORT = {"server": {"server", "ninfer_jax", "ledger", "pallas_kernels"},
              "ninfer_jax": {"ninfer_jax", "ledger", "pallas_kernels"},
              "ledger": {"ledger"},
              "pallas_kernels": {"pallas_kernels"}}
MAX_LINES = 600
RECLAMATION = ROOT / "ledger" / "reclamation"
MAX_RECLAMATION_LINES = 400


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the production packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The production module `name` loads: itself, or the deepest module its dotted path names."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> list[tuple[str, int]]:
    """(target module, line) for each production module `module` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def add(name: str | None, line: int) -> None:
        target = _resolve(name) if name else None
        if target is not None and target != module:
            found.append((target, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:  # `from a.b import c`: the module a.b.c where there is one
                add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source, node.lineno)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in ("import_module", "__import__"):
                add(node.args[0].value, node.lineno)
    return found


def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line importing it}."""
    graph = {}
    for module, path in MODULES.items():
        edges: dict[str, int] = {}
        for target, line in _imports(module, path):
            edges.setdefault(target, line)
        graph[module] = edges
    return graph


GRAPH = _graph()


def _file(module: str) -> str:
    return str(MODULES[module].relative_to(ROOT))


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _a_cycle(component: list[str]) -> list[str]:
    """One cycle through the component's first module, as the modules along it (first = last)."""
    members = set(component)
    first = component[0]
    paths = {first: [first]}
    queue = [first]
    while queue:  # breadth first: the shortest way back to `first`
        node = queue.pop(0)
        for child in sorted(GRAPH[node]):
            if child == first:
                return paths[node] + [first]
            if child in members and child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    return component + [first]


def test_the_graph_sees_the_imports():
    """The reader finds known edges of every kind (module level, in a function, relative, a
    package's __init__), so an empty graph cannot pass the checks below."""
    assert "ninfer_jax.cli" in GRAPH["server.cli"]  # module level, `from ninfer_jax import cli`
    assert "ninfer_jax.plan" in GRAPH["ninfer_jax.program.program"]
    assert "ninfer_jax.plan.capacity_plan" in GRAPH["ninfer_jax.plan"]  # a package's __init__ re-exporting
    assert "server.cli_commands" in GRAPH["server.cli"]  # inside a function
    assert "ninfer_jax.program.device_memory" in GRAPH["ninfer_jax.plan.budget"]  # inside a function
    assert sum(len(edges) for edges in GRAPH.values()) > 500


def test_no_import_cycle():
    cycles = _strongly_connected(GRAPH)
    lines = []
    for component in cycles:
        cycle = _a_cycle(component)
        steps = " -> ".join(f"{_file(a)} (line {GRAPH[a][b]})" for a, b in zip(cycle, cycle[1:]))
        lines.append(f"{steps} -> {_file(cycle[0])}\n    files in this cycle: "
                     f"{', '.join(_file(m) for m in component)}")
    assert not cycles, f"{len(cycles)} import cycle(s) between production files:\n  " + "\n  ".join(lines)


def test_no_upward_import():
    """server -> ninfer_jax -> {ledger, pallas_kernels}: no package imports one above it."""
    upward = []
    for module, edges in sorted(GRAPH.items()):
        package = module.split(".")[0]
        for target, line in sorted(edges.items()):
            if target.split(".")[0] not in MAY_IMPORT[package]:
                upward.append(f"{_file(module)}:{line} imports {target} ({_file(target)})")
    assert not upward, (f"{len(upward)} import(s) against the layering server -> ninfer_jax -> "
                        f"{{ledger, pallas_kernels}}:\n  " + "\n  ".join(upward))


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_production_module_over_600_lines():
    big = [f"{_file(m)}: {n} lines" for m, p in sorted(MODULES.items()) if (n := _line_count(p)) > MAX_LINES]
    assert not big, f"production modules over {MAX_LINES} lines:\n  " + "\n  ".join(big)


def test_reclamation_modules_stay_under_400_lines():
    """The reclamation package's modules (ledger/reclamation/; none while it does not exist)."""
    modules = sorted(p for p in RECLAMATION.rglob("*.py") if "__pycache__" not in p.parts) \
        if RECLAMATION.is_dir() else []
    big = [f"{p.relative_to(ROOT)}: {n} lines" for p in modules if (n := _line_count(p)) > MAX_RECLAMATION_LINES]
    assert not big, f"reclamation modules over {MAX_RECLAMATION_LINES} lines:\n  " + "\n  ".join(big)
