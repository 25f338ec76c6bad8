"""Worker of scripts/bench_side_by_side.py: builds one geometry's CompiledSteps in the checkout on
PYTHONPATH (the code before issue 33, 9370fd4, or after), then on each stdin line `case n` runs n
steps of that case and prints seconds per step. Cases: d1 (one request: the 2-row bucket, the
old code's 1-row step), d8 (8 rows), p64 (one 64-token prefill chunk); PAGES pages of Main KV a
row (page table width), decode at position CTX."""
import math, os, sys, time
import numpy as np, jax, jax.numpy as jnp

geom = sys.argv[1]
try:
    from ninfer_jax.model.compiled import CompiledSteps
    from ninfer_jax.model.pools import PAGE_SIZE, init_pools
    NEW = True
except ImportError:
    from ninfer_jax.model.steps import PAGE_SIZE, CompiledSteps, init_pools
    NEW = False
from ninfer_jax.model.model import load_model, Model
if geom == "builtin":
    from ninfer_jax.model import builtin
    model = load_model(builtin.NAME)
else:
    import importlib.util  # geometries.py is newer than 9370fd4: read this checkout's (plain data)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("geo", os.path.join(here, "ninfer_jax/bench/geometries.py"))
    geo = importlib.util.module_from_spec(spec); spec.loader.exec_module(geo)
    from ninfer_jax.model.config import parse_config
    from ninfer_jax.model.modules import init_params
    cfg = parse_config(dict(geo.GEOMETRIES[geom]))
    params, _ = init_params(cfg, seed=0, dtype=np.float32)
    model = Model(cfg, jax.tree.map(jnp.asarray, params), jnp.float32, "random")
cfg = model.config
steps = CompiledSteps(model, progress=False)
import os; PAGES = int(os.environ.get("PAGES", "4")); CTX = int(os.environ.get("CTX", "200"))

nb = 8
if NEW:
    kv, state = init_pools(cfg, nb * PAGES + 8, nb, model.dtype, steps.backend)
else:
    kv, state = init_pools(cfg, nb * PAGES + 8, nb, model.dtype)
table = np.arange(nb * PAGES, dtype=np.int32).reshape(nb, PAGES)
pools = [kv, state]

def decode_args(c):
    b = c if c > 1 or not NEW else 2
    slots = np.where(np.arange(b) < c, np.arange(b), -1).astype(np.int32)
    toks = np.full(b, 7, np.int32)
    pos = np.where(slots >= 0, CTX, 0).astype(np.int32)
    return [jnp.asarray(a) for a in (toks, pos, table[:b], slots)]

cases = {}
cases["d1"] = ("decode", decode_args(1))
cases["d8"] = ("decode", decode_args(8))
toks = np.full((1, 64), 5, np.int32)
cases["p64"] = ("prefill", [jnp.asarray(a) for a in (toks, np.array([64], np.int32), np.array([64], np.int32), table[:1], np.array([0], np.int32))])

def run(case, n):
    kind, args = cases[case]
    fn = getattr(steps, kind)
    kv, state = pools
    t = time.perf_counter()
    for _ in range(n):
        out = fn(kv, state, *args)
        kv, state = out[2], out[3]
    jax.block_until_ready(out[0])
    dt = (time.perf_counter() - t) / n
    pools[:] = [kv, state]
    return dt

for c in os.environ.get("CASES", "d1,d8,p64").split(","):
    run(c, 3)
print("ready", flush=True)
for line in sys.stdin:
    case, n = line.split()
    print(f"{run(case, int(n)):.9f}", flush=True)
