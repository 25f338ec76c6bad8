"""Two checkouts' compiled steps timed in turn (issue 33: batch invariance's cost).

    python scripts/bench_side_by_side.py GEOMETRY CASES PAIRS STEPS REPS [NEW_ROOT]

GEOMETRY: builtin or a bench/geometries.py name (random weights); CASES: d1,d8,p64
(_side_by_side_worker.py). One worker process per checkout (OLDROOT, default /work/wt_before:
a worktree of 9370fd4; NEW_ROOT default this checkout), each warmed up; then PAIRS pairs of
rounds, alternating which goes first; a round is REPS blocks of STEPS steps, its time the median
block (STAT=min: the fastest). Prints the median of the pair ratios new/old. Env: PAGES, CTX,
CASES (the cases a worker compiles). Run under `flock /tmp/bench.lock` on a shared machine."""
import os, statistics, subprocess, sys
geom, cases, pairs, n, reps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
roots = {"old": os.environ.get("OLDROOT", "/work/wt_before"), "new": sys.argv[6] if len(sys.argv) > 6 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
procs = {}
for k, root in roots.items():
    env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu")
    procs[k] = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_side_by_side_worker.py"), geom], cwd=root, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
for p in procs.values():
    assert p.stdout.readline().strip() == "ready"
def ask(k, case):
    ts = []
    for _ in range(reps):
        procs[k].stdin.write(f"{case} {n}\n"); procs[k].stdin.flush()
        ts.append(float(procs[k].stdout.readline()))
    return min(ts) if os.environ.get("STAT") == "min" else statistics.median(ts)
for case in cases:
    ratios, olds, news = [], [], []
    for i in range(pairs):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        t = {k: ask(k, case) for k in order}
        ratios.append(t["new"] / t["old"]); olds.append(t["old"]); news.append(t["new"])
    print(f"{geom} {case}: ratio median {statistics.median(ratios):.3f} (pairs {', '.join(f'{r:.2f}' for r in ratios)}); "
          f"old {statistics.median(olds)*1e3:.3f} ms, new {statistics.median(news)*1e3:.3f} ms; min old {min(olds)*1e3:.3f} new {min(news)*1e3:.3f} (ratio of mins {min(news)/min(olds):.3f})", flush=True)
for p in procs.values():
    p.stdin.close(); p.wait()
