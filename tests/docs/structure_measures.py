"""The structural measures docs/architecture.md quotes, read from the source (nothing imported).

    python tests/docs/structure_measures.py [--json] [ROOT]

ROOT (default: this repository) may be another checkout of the project, e.g. an older commit
unpacked with `git archive COMMIT | tar -x -C /tmp/old`, to compare before and after. The
measures, over the production packages ninfer_jax/, ledger/, server/ and pallas_kernels/:

* import cycles: strongly connected components of the static import graph of more than one
  module (tests/test_import_graph.py's reader: every import, at module level or in a function);
* upward imports: file edges against the layering server -> ninfer_jax -> {ledger,
  pallas_kernels}, and the package arrows they make;
* production modules over 600 lines (and, under ledger/reclamation/, over 400);
* module-level mutable objects in ledger/ (tests/ledger/test_no_global_state.py's scan: dict,
  list and set displays and calls in module and class bodies, mutable defaults, `global`);
* `obj._private` accesses across engine collaborators: in ninfer_jax/engine/, an attribute
  `x._name` read on anything but `self` or `cls` (`core._finish`, `self.core._bind`,
  `req.handle._push`); NamedTuple's public `_replace`, `_fields`, `_asdict`, `_make` excepted.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2]
NAMEDTUPLE_API = frozenset({"_replace", "_fields", "_asdict", "_make", "_field_defaults"})


def _load(path: Path, name: str, extra_path: Path | None = None):
    if extra_path is not None and str(extra_path) not in sys.path:
        sys.path.insert(0, str(extra_path))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_graph(root: Path):
    """tests/test_import_graph.py's reader, pointed at `root`."""
    g = _load(HERE / "tests" / "test_import_graph.py", "_import_graph_reader")
    g.ROOT = root
    g.MODULES = g._modules()
    g.GRAPH = g._graph()
    return g


def private_accesses(root: Path) -> list[str]:
    out = []
    for path in sorted((root / "ninfer_jax" / "engine").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")) or node.attr in NAMEDTUPLE_API:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            out.append((path.relative_to(root).as_posix(), node.lineno, ast.unparse(node)))
    return [f"{f}:{n}: {text}" for f, n, text in sorted(out)]


def measures(root: Path) -> dict:
    g = import_graph(root)
    cycles = [[g._file(m) for m in c] for c in g._strongly_connected(g.GRAPH)]
    upward = []
    for module, edges in sorted(g.GRAPH.items()):
        package = module.split(".")[0]
        for target in sorted(edges):
            if target.split(".")[0] not in g.MAY_IMPORT[package]:
                upward.append((g._file(module), g._file(target), package, target.split(".")[0]))
    sizes = {g._file(m): len(p.read_text(encoding="utf-8").splitlines()) for m, p in g.MODULES.items()}
    reclamation = {f: n for f, n in sizes.items() if f.startswith("ledger/reclamation/")}
    if str(HERE) not in sys.path:  # the scan's module imports the ledger's test helpers
        sys.path.insert(0, str(HERE))
    state = _load(HERE / "tests" / "ledger" / "test_no_global_state.py", "_no_global_state",
                  extra_path=HERE / "tests" / "ledger")
    mutable = [f for p in sorted((root / "ledger").rglob("*.py")) if "__pycache__" not in p.parts
               for f in state.mutable_module_state(p, p.relative_to(root).as_posix())]
    private = private_accesses(root)
    return {
        "production_modules": len(g.MODULES),
        "production_lines": sum(sizes.values()),
        "import_edges": sum(len(e) for e in g.GRAPH.values()),
        "import_cycles": len(cycles), "cycles": cycles,
        "upward_imports": len(upward), "upward_package_arrows": sorted({f"{a} -> {b}" for *_, a, b in upward}),
        "upward": [f"{a} imports {b}" for a, b, *_ in upward],
        "modules_over_600_lines": sorted(f"{f}: {n}" for f, n in sizes.items() if n > 600),
        "largest_module": max(sizes.items(), key=lambda kv: kv[1]),
        "reclamation_modules": len(reclamation),
        "reclamation_over_400_lines": sorted(f"{f}: {n}" for f, n in reclamation.items() if n > 400),
        "largest_reclamation_module": max(reclamation.items(), key=lambda kv: kv[1]) if reclamation else None,
        "ledger_module_level_mutable": mutable,
        "engine_private_accesses": private,
    }


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    args = [a for a in argv if a != "--json"]
    root = Path(args[0]).resolve() if args else HERE
    m = measures(root)
    if as_json:
        print(json.dumps(m, indent=1))
        return 0
    print(f"{root}: {m['production_modules']} production modules, {m['production_lines']} lines, "
          f"{m['import_edges']} import edges")
    print(f"import cycles among production modules: {m['import_cycles']}")
    for c in m["cycles"]:
        print("   ", ", ".join(c))
    print(f"upward imports: {m['upward_imports']} file edges, {len(m['upward_package_arrows'])} package arrows "
          f"{m['upward_package_arrows'] or ''}")
    for u in m["upward"]:
        print("   ", u)
    print(f"production modules over 600 lines: {len(m['modules_over_600_lines'])} "
          f"(largest: {m['largest_module'][0]}, {m['largest_module'][1]} lines)")
    for s in m["modules_over_600_lines"]:
        print("   ", s)
    if m["largest_reclamation_module"]:
        print(f"ledger/reclamation/ modules over 400 lines: {len(m['reclamation_over_400_lines'])} of "
              f"{m['reclamation_modules']} (largest: {m['largest_reclamation_module'][0]}, "
              f"{m['largest_reclamation_module'][1]} lines)")
    print(f"module-level mutable objects in ledger/: {len(m['ledger_module_level_mutable'])}")
    for s in m["ledger_module_level_mutable"]:
        print("   ", s)
    print(f"obj._private accesses across engine collaborators (ninfer_jax/engine/): "
          f"{len(m['engine_private_accesses'])}")
    for s in m["engine_private_accesses"]:
        print("   ", s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
