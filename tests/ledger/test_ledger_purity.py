"""The layout (README): `ledger/` is pure Python and imports nothing from JAX, numpy or the project."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import ledger

FORBIDDEN = ("jax", "jaxlib", "numpy", "ninfer_jax", "pallas_kernels", "server", "flax", "torch")


def test_ledger_sources_import_only_stdlib_immutables_and_ledger():
    root = pathlib.Path(ledger.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_importing_ledger_loads_no_jax_or_numpy():
    code = ("import sys, ledger, ledger.capacity; "
            f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
