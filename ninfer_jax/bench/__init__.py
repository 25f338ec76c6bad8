"""Benchmarks reached through `ninfer bench NAME [--json]`.

Each module named in BENCHES defines `run(argv: list[str]) -> dict`: it does the work, prints
progress to stderr, and returns one flat-ish dict of figures that the CLI prints (as one JSON
object with --json, as aligned lines otherwise; a module with a `text(figures) -> str` prints
that instead of aligned lines). The server's benchmark (`ninfer bench serve`, server/serve_bench.py)
is added to these by the server's CLI (server/cli.py): ninfer_jax does not import the server.
"""
import importlib

BENCHES = {
    "model": "ninfer_jax.bench.model_bench",
    "ledger": "ninfer_jax.bench.ledger_bench",
    "engine": "ninfer_jax.bench.engine_bench",
    "preempt": "ninfer_jax.bench.preempt_bench",
    "spec": "ninfer_jax.bench.spec_bench",
    "vs_hf": "ninfer_jax.bench.vs_hf_bench",
    "vision": "ninfer_jax.bench.vision_bench",
    "prefill": "ninfer_jax.bench.prefill_bench",
    "structured": "ninfer_jax.bench.structured_bench",
    "optimum": "ninfer_jax.bench.optimum_bench",
    "scanmix": "ninfer_jax.bench.scanmix_bench",
}


def int_arg(argv: list[str], name: str, default: int) -> int:
    """`--name=N` or `--name N` among a benchmark's own arguments, else `default`."""
    for i, a in enumerate(argv):
        if a.startswith(f"--{name}="):
            return int(a.split("=", 1)[1])
        if a == f"--{name}" and i + 1 < len(argv):
            return int(argv[i + 1])
    return default


def str_arg(argv: list[str], name: str, default: str) -> str:
    """`--name=V` or `--name V` among a benchmark's own arguments, else `default`."""
    for i, a in enumerate(argv):
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
        if a == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
    return default


def load(name: str, benches: dict[str, str] | None = None):
    """The module of benchmark `name` among `benches` (default: ninfer_jax's own, BENCHES)."""
    benches = BENCHES if benches is None else benches
    if name not in benches:
        raise KeyError(f"unknown benchmark {name!r}; choose one of {sorted(benches)}")
    return importlib.import_module(benches[name])
