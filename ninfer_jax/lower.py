"""`ninfer lower`: every compiled step and every Pallas kernel lowered for a GPU, from shapes alone.

Nothing here needs the GPU or the weights. The model is an abstract `HybridLM` (`nnx.eval_shape`
over `weights.param_shapes`: every leaf a `jax.ShapeDtypeStruct`), the pools are `init_pools` /
`init_mtp_pool` (a DFlash drafter's: `init_dflash_pool`) under `jax.eval_shape`, sized by the
capacity plan of the engine flags (`plan_capacity`: config.json only, as `ninfer plan`). Each step is jitted as the engine jits it
(`compiled.CompiledSteps`, `unit_pool._JIT`, `Program._hidden_logits`) and lowered with

    jax.jit(f).trace(*abstract_args).lower(lowering_platforms=(platform,))

which runs the Pallas -> Triton lowering of every kernel inside (power-of-two blocks, dot
shapes, supported primitives) but not Triton's own compilation, which needs the device.

What is lowered (`plan_lowering`), at the Program's shapes (program.py):
  step    prefill[t] for every chunk length (plan/workspace.prefill_chunk_lengths; with the xla backend
          one per page-table width too, prefill[t,p]: plan/workspace.prefill_table_widths) and decode[b]
          for every decode bucket; with an MTP head (and speculative_tokens > 0, default 2), or a DFlash
          drafter (--speculative_method=dflash --draft_model=FOLDER: its config.json only), prefill_spec,
          spec_decode[b,k] and spec_commit[b,k];
  head    hidden_logits, the head an exact hit samples from; mask_logits[b], structured output's mask;
  mover   each pool's byte movers (pack, unpack, copy, hidden) at their smallest and largest
          index bucket (unit_pool.py);
  kernel  each Pallas kernel alone at the model's shapes (paged attention write/prefill/decode,
          the gated delta rule chunk and step, conv1d prefill and update, page gather/scatter/copy).

`lower_steps(plan)` yields one `StepResult` per step (lowered or not, the custom-call targets
the StableHLO holds — `__gpu$xla.gpu.triton` for a Triton kernel — and the Pallas kernel names);
a step that fails is reported with its error's first line and the others still run.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re
import time
from typing import Any, Callable, Iterator

from ninfer_jax.config import BACKENDS as KERNEL_BACKENDS  # EngineConfig.backend's (the kernel files' backends)
from ninfer_jax.errors import ConfigError
from ninfer_jax.lower_abstract import Abstract, i32, sds, spec_pool_id

PLATFORMS = ("cuda", "rocm", "cpu")  # what lowering_platforms accepts for these steps
GPU_PLATFORMS = ("cuda", "rocm")
DEFAULT_DRAFTS = 2  # speculative steps lowered for a model with an MTP head when no k is given
KINDS = ("step", "head", "mover", "kernel")
TRITON = "__gpu$xla.gpu.triton"  # the custom-call target of a Pallas Triton kernel


class LoweringError(Exception):
    """One or more steps did not lower (`ninfer lower` exits 1 with it)."""


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The sizes steps are lowered at: the Program's for this config (program.py)."""

    model: str
    cfg: Any  # ModelConfig
    dtype: str  # "float32" | "bfloat16"
    chunk_size: int  # the prefill bucket: one row of chunk_size tokens
    decode_buckets: tuple[int, ...]
    pages_per_request: int  # the page tables' width
    prefill_widths: tuple[int, ...]  # a prefill chunk's page-table widths (the XLA attention's; Pallas: one)
    prefill_lengths: tuple[int, ...]  # a prefill chunk's token lengths (chunk_size and its quarters)
    kv_pages: int  # Main KV pages
    state_slots: int  # StateImage slots
    mtp_pages: int  # the speculative pool's pages: the MTP layers' or the DFlash drafter's (0: none)
    speculative_tokens: int  # k of the speculative steps (0: none lowered)
    drafter: Any = None  # a DFlash drafter's DFlashConfig (speculative_method "dflash"), else None: MTP

    def as_dict(self) -> dict:
        return {"model": self.model, "model_type": self.cfg.model_type, "dtype": self.dtype,
                "chunk_size": self.chunk_size, "decode_buckets": list(self.decode_buckets),
                "pages_per_request": self.pages_per_request, "prefill_widths": list(self.prefill_widths),
                "prefill_lengths": list(self.prefill_lengths),
                "kv_pages": self.kv_pages,
                "state_slots": self.state_slots, "mtp_pages": self.mtp_pages,
                "speculative_tokens": self.speculative_tokens,
                "speculative_method": "dflash" if self.drafter is not None else "mtp" if self.speculative_tokens else None}


@dataclasses.dataclass(frozen=True)
class Step:
    """One thing to lower: `BUILDERS[builder](abstract, **params)` gives (jitted fn, abstract args)."""

    name: str  # e.g. "decode[b=4]"
    kind: str  # one of KINDS
    builder: str
    params: tuple[tuple[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class LowerPlan:
    shapes: Shapes
    platform: str
    backend: str  # the kernels' backend: "pallas" lowers the Triton kernels
    steps: tuple[Step, ...]


@dataclasses.dataclass(frozen=True)
class StepResult:
    name: str
    kind: str
    ok: bool
    seconds: float
    custom_calls: dict[str, int]  # custom-call target -> count in the StableHLO
    kernels: dict[str, int]  # Pallas kernel (pallas_call name) -> count
    error: str | None = None  # "ErrorClass: first line" when it did not lower

    def line(self) -> str:
        if not self.ok:
            return f"FAILED  {self.name}  {self.error}"
        calls = ", ".join(f"{t} x{n}" for t, n in self.custom_calls.items()) or "none"
        line = f"lowered {self.name}  custom calls: {calls}"
        if self.kernels:
            line += "  kernels: " + ", ".join(f"{k} x{n}" for k, n in self.kernels.items())
        return line

    def as_dict(self) -> dict:
        return dict(dataclasses.asdict(self), seconds=round(self.seconds, 3))


# ---- the plan: flags -> shapes -> steps (cheap: config.json only) ---------------------------

def check_platform(platform: str, backend: str | None) -> str:
    """The kernels' backend for `platform` (default: pallas on a GPU, xla on cpu), or a ConfigError."""
    if platform not in PLATFORMS:
        raise ConfigError("platform", f"must be one of {PLATFORMS} (tpu: these kernels are written for Triton, "
                                      f"not Mosaic TPU), got {platform!r}")
    if backend is None:
        return "pallas" if platform in GPU_PLATFORMS else "xla"
    if backend not in KERNEL_BACKENDS:
        raise ConfigError("backend", f"must be one of {KERNEL_BACKENDS}, got {backend!r}")
    if backend == "pallas" and platform not in GPU_PLATFORMS:
        raise ConfigError("backend", f"pallas lowers through Triton, for {' or '.join(GPU_PLATFORMS)}; "
                                     f"for {platform} use xla or interpret")
    return backend


def shapes_for(config, backend: str, speculative_tokens: int | None = None) -> Shapes:
    """The Program's sizes for `config` (an EngineConfig) running `backend`, read from config.json
    alone: the pools and decode buckets of its capacity plan. `speculative_tokens` None:
    DEFAULT_DRAFTS when the model has an MTP head or `config` names a DFlash drafter
    (`speculative_method="dflash"`, `draft_model`: its config.json only), else 0.
    ConfigError for an unknown model, a bad config.json, k > 0 without an MTP head, a drafter
    that does not fit or a capacity that cannot fit."""
    from ninfer_jax.engine.preflight import itemsize, model_config
    from ninfer_jax.plan import plan_capacity
    from ninfer_jax.plan.pools import drafter_config

    cfg = model_config(config.model)
    dflash = config.speculative_method == "dflash"
    if speculative_tokens is None:
        speculative_tokens = DEFAULT_DRAFTS if cfg.mtp_num_hidden_layers or dflash else 0
    # The engine that runs these steps: its kernels' backend (workspace) and its speculative pool.
    config = dataclasses.replace(config, speculative_tokens=speculative_tokens, backend=backend)
    drafter = drafter_config(config, cfg) if dflash and speculative_tokens else None
    plan = plan_capacity(config, cfg, itemsize(config))  # the pools and the decode buckets the Program builds
    capacity = plan.capacity
    return Shapes(model=config.model, cfg=cfg, dtype=config.resolved_dtype, chunk_size=config.chunk_size,
                  decode_buckets=plan.decode_buckets,
                  pages_per_request=capacity.pages_per_request, prefill_widths=plan.prefill_widths,
                  prefill_lengths=plan.prefill_lengths,
                  kv_pages=capacity.kv_pages,
                  state_slots=capacity.state_slots, mtp_pages=capacity.mtp_pages,
                  speculative_tokens=speculative_tokens, drafter=drafter)


def _mover_buckets(units: int) -> dict[str, list[int]]:
    """The smallest and largest of each mover's buckets (`unit_pool.mover_buckets`)."""
    from ninfer_jax.program.unit_pool import mover_buckets

    return {mover: sorted({sizes[0], sizes[-1]}) for mover, sizes in mover_buckets(units).items()}


def all_steps(shapes: Shapes) -> list[Step]:
    """Every step `ninfer lower` lowers for these shapes, in order."""
    from ledger import MAIN_KV, STATE_POOL

    t, k = shapes.chunk_size, shapes.speculative_tokens
    widths = shapes.prefill_widths

    def prefill(kind: str) -> list[Step]:  # one per chunk length and page-table width (named when several)
        return [Step(f"{kind}[t={n}]" if len(widths) == 1 else f"{kind}[t={n},p={p}]", "step", kind,
                     (("t", n),) + ((("p", p),) if len(widths) > 1 else ()))
                for n in shapes.prefill_lengths for p in widths]

    out = prefill("prefill")
    out += [Step(f"decode[b={b}]", "step", "decode", (("b", b),)) for b in shapes.decode_buckets]
    if k:
        out += prefill("prefill_spec")
        for b in shapes.decode_buckets:
            out.append(Step(f"spec_decode[b={b},k={k}]", "step", "spec_decode", (("b", b),)))
            out.append(Step(f"spec_commit[b={b},k={k}]", "step", "spec_commit", (("b", b),)))
    out.append(Step("hidden_logits", "head", "hidden_logits"))
    if not k:  # structured output's mask step after a decode step (a Verify unit masks on the host)
        out += [Step(f"mask_logits[b={b}]", "head", "mask_logits", (("b", b),)) for b in shapes.decode_buckets]
    pools = [(MAIN_KV, shapes.kv_pages), (STATE_POOL, shapes.state_slots)]
    if k:
        pools.append((spec_pool_id(shapes), shapes.mtp_pages))
    for pool, units in pools:
        for mover, sizes in _mover_buckets(units).items():
            out += [Step(f"{mover}[{pool},n={n}]", "mover", "mover", (("pool", pool), ("mover", mover), ("n", n)))
                    for n in sizes]
        if pool == STATE_POOL:
            out.append(Step(f"hidden[{pool},n=1]", "mover", "mover", (("pool", pool), ("mover", "hidden"), ("n", 1))))
    b = shapes.decode_buckets[-1]
    for name, dim in KERNELS.items():
        size = {"t": t, "b": b}[dim]
        out.append(Step(f"{name}[{dim}={size}]", "kernel", "kernel", (("name", name),)))
    return out


def select(steps: list[Step], only: str | None) -> list[Step]:
    """The steps whose name starts with one of the comma-separated prefixes in `only` (or whose
    kind is one of them: step, head, mover, kernel); all when `only` is empty. ConfigError for a
    prefix that selects nothing."""
    if not only:
        return steps
    prefixes = [p.strip() for p in only.split(",") if p.strip()]
    chosen = []
    for p in prefixes:
        hits = [s for s in steps if s.kind == p or s.name.startswith(p)]
        if not hits:
            names = sorted({s.name.split("[")[0] for s in steps})
            raise ConfigError("steps", f"{p!r} selects no step; names start with one of {names}, or give a kind "
                                       f"{KINDS}")
        chosen += hits
    return [s for s in steps if s in chosen]


def plan_lowering(config, *, platform: str = "cuda", backend: str | None = None,
                  speculative_tokens: int | None = None, only: str | None = None) -> LowerPlan:
    """Everything `lower_steps` needs, checked: ConfigError for a bad platform, backend, model,
    size or step selection (`ninfer lower` exits 2 with it). Reads config.json only."""
    backend = check_platform(platform, backend)
    shapes = shapes_for(config, backend, speculative_tokens)
    return LowerPlan(shapes=shapes, platform=platform, backend=backend, steps=tuple(select(all_steps(shapes), only)))


# ---- builders: (Abstract, **params) -> (jitted function, abstract arguments) ------------------
# The model steps are jitted by compiled.jit_step, as CompiledSteps jits them; the head and movers as
# Program and UnitPool do.

def _build_prefill(a: Abstract, p: int | None = None, t: int | None = None):
    from ninfer_jax.model.compiled import jit_step

    s, (merger, leaves), (kv, state) = a.shapes, a.model, a.pools
    fn = jit_step("prefill", a.cfg, a.backend, merger)
    p = p or s.pages_per_request
    return fn, (leaves, kv, state, i32(1, t or s.chunk_size), i32(1), i32(1), i32(1, p), i32(1))


def _build_decode(a: Abstract, b: int):
    from ninfer_jax.model.compiled import jit_step

    s, (merger, leaves), (kv, state) = a.shapes, a.model, a.pools
    fn = jit_step("decode", a.cfg, a.backend, merger)
    return fn, (leaves, kv, state, i32(b), i32(b), i32(b, s.pages_per_request), i32(b))


def _build_prefill_spec(a: Abstract, p: int | None = None, t: int | None = None):
    from ninfer_jax.model.compiled import jit_step

    s, (merger, leaves), (kv, state) = a.shapes, a.spec_model, a.pools
    fn = jit_step("prefill_spec", a.cfg, a.backend, merger, dcfg=s.drafter)
    p = p or s.pages_per_request
    return fn, (leaves, kv, state, a.spec_pool, i32(1, t or s.chunk_size), i32(1), i32(1), i32(1, p),
                i32(1, p), i32(1))


def _build_spec_decode(a: Abstract, b: int):
    from ninfer_jax.model.compiled import jit_step

    s, (merger, leaves), (kv, state) = a.shapes, a.spec_model, a.pools
    fn = jit_step("spec_decode", a.cfg, a.backend, merger, s.speculative_tokens, s.drafter)
    p = s.pages_per_request
    return fn, (leaves, kv, state, a.spec_pool, i32(b), i32(b), i32(b, p), i32(b, p), i32(b), i32(b))


def _build_spec_commit(a: Abstract, b: int):
    import jax

    from ninfer_jax.model.compiled import jit_step

    decode, decode_args = _build_spec_decode(a, b)
    _, drafts, final, verified, _, _ = jax.eval_shape(decode, *decode_args)  # what Program keeps between them
    merger, leaves = a.spec_model
    fn = jit_step("spec_commit", a.cfg, a.backend, merger, dcfg=a.shapes.drafter)
    p = a.shapes.pages_per_request
    return fn, (leaves, a.pools[1], a.spec_pool, verified, final, drafts, i32(b), i32(b), i32(b, p), i32(b))


def _build_hidden_logits(a: Abstract):
    import jax

    from ninfer_jax.model.model import lm_head

    return jax.jit(lm_head), (a.params, sds((a.cfg.hidden_size,), a.dtype))


def _build_mask_logits(a: Abstract, b: int):
    import jax
    import jax.numpy as jnp

    from ninfer_jax.model import token_mask

    v = a.cfg.vocab_size
    return jax.jit(token_mask.mask_logits), (sds((b, v), jnp.float32), sds((b, token_mask.words(v)), jnp.uint32))


def _build_mover(a: Abstract, pool: str, mover: str, n: int):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ninfer_jax.program.unit_pool import _JIT

    tree = a.pool(pool)
    leaves = [sds(leaf.shape, leaf.dtype) for leaf in jax.tree.leaves(tree)]  # UnitPool's flatten order
    idx = i32(n)
    if mover == "pack":
        args = (leaves, idx)
    elif mover == "unpack":
        unit_bytes = sum(math.prod(x.shape[1:]) * np.dtype(x.dtype).itemsize for x in leaves)
        args = (leaves, idx, sds((n, unit_bytes), jnp.uint8))
    elif mover == "copy":
        args = (leaves, idx, idx)
    elif mover == "hidden":
        args = (tree["hidden"], idx)
    else:
        raise ValueError(f"unknown mover {mover!r}")
    return _JIT[mover], args


# The Pallas kernels alone: wrapper -> the dimension its name shows (t: the prefill chunk,
# b: the largest decode bucket), each at the model's shapes and the planned pools.
KERNELS = {
    "paged_attention.write_kv": "t",
    "paged_attention.prefill_attention": "t",
    "paged_attention.decode_attention": "b",
    "gdn.chunk_gated_delta_rule": "t",
    "gdn.recurrent_gated_delta_rule_step": "b",
    "conv1d.causal_conv1d_prefill": "t",
    "conv1d.causal_conv1d_update": "b",
    "page_copy.gather": "b",
    "page_copy.scatter": "b",
    "page_copy.copy": "b",
}


def _kernel_case(a: Abstract, name: str) -> tuple[Callable, tuple, dict]:
    import jax.numpy as jnp

    from ninfer_jax.model.pools import PAGE_SIZE

    from ninfer_jax.model.steps import GDN_CHUNK
    from pallas_kernels import conv1d, gdn, page_copy, paged_attention

    cfg, s, dt, f32 = a.cfg, a.shapes, a.dtype, jnp.float32
    t, b, p = s.chunk_size, s.decode_buckets[-1], s.pages_per_request
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    c, kk = cfg.conv_dim, cfg.linear_conv_kernel_dim
    pages = sds((s.kv_pages, PAGE_SIZE, hkv, d), dt)  # a Main KV layer
    slots = sds((s.state_slots, hv, dk, dv), f32)  # a StateImage recurrent pool
    scale = d ** -0.5
    cases = {
        "paged_attention.write_kv": (paged_attention.write_kv, (pages, pages, sds((1, t, hkv, d), dt),
                                     sds((1, t, hkv, d), dt), i32(1, p), i32(1), i32(1)), {}),
        "paged_attention.prefill_attention": (paged_attention.prefill_attention, (sds((1, t, hq, d), dt), pages,
                                              pages, i32(1, p), i32(1), i32(1)), {"scale": scale}),
        "paged_attention.decode_attention": (paged_attention.decode_attention, (sds((b, hq, d), dt), pages, pages,
                                             i32(b, p), i32(b)), {"scale": scale}),
        "gdn.chunk_gated_delta_rule": (gdn.chunk_gated_delta_rule, (
            sds((1, t, hv, dk), f32), sds((1, t, hv, dk), f32), sds((1, t, hv, dv), f32), sds((1, t, hv), f32),
            sds((1, t, hv), f32), sds((1, hv, dk, dv), f32)), {"chunk_size": GDN_CHUNK}),
        "gdn.recurrent_gated_delta_rule_step": (gdn.recurrent_gated_delta_rule_step, (
            sds((b, hv, dk), f32), sds((b, hv, dk), f32), sds((b, hv, dv), f32), sds((b, hv), f32),
            sds((b, hv), f32), sds((b, hv, dk, dv), f32)), {}),
        "conv1d.causal_conv1d_prefill": (conv1d.causal_conv1d_prefill, (
            sds((1, t, c), dt), sds((1, kk - 1, c), dt), sds((c, kk), dt), i32(1)), {}),
        "conv1d.causal_conv1d_update": (conv1d.causal_conv1d_update, (
            sds((b, c), dt), sds((b, kk - 1, c), dt), sds((c, kk), dt)), {}),
        "page_copy.gather": (page_copy.gather, (slots, i32(b)), {}),
        "page_copy.scatter": (page_copy.scatter, (slots, i32(b), sds((b, hv, dk, dv), f32)), {}),
        "page_copy.copy": (page_copy.copy, (slots, i32(b), i32(b)), {}),
    }
    return cases[name]


def _build_kernel(a: Abstract, name: str):
    import jax

    fn, args, kwargs = _kernel_case(a, name)
    return jax.jit(functools.partial(fn, backend=a.backend, **kwargs)), args


BUILDERS: dict[str, Callable] = {
    "prefill": _build_prefill,
    "decode": _build_decode,
    "prefill_spec": _build_prefill_spec,
    "spec_decode": _build_spec_decode,
    "spec_commit": _build_spec_commit,
    "hidden_logits": _build_hidden_logits,
    "mask_logits": _build_mask_logits,
    "mover": _build_mover,
    "kernel": _build_kernel,
}


# ---- lowering ---------------------------------------------------------------------------------

_TARGET = re.compile(r"custom_call @([^\s(]+)|call_target_name = \"([^\"]+)\"")
_KERNEL_NAME = re.compile(r"\bname = \"([^\"]+)\"")


def custom_calls(text: str) -> tuple[dict[str, int], dict[str, int]]:
    """(custom-call target -> count, Pallas kernel name -> count) of a StableHLO text. A Triton
    call carries its kernel's name in its backend config (the pallas_call's `name=`)."""
    targets: collections.Counter = collections.Counter()
    kernels: collections.Counter = collections.Counter()
    for line in text.splitlines():
        m = _TARGET.search(line)
        if not m:
            continue
        targets[m.group(1) or m.group(2)] += 1
        n = _KERNEL_NAME.search(line[m.end():])
        if n:
            kernels[n.group(1)] += 1
    return dict(targets.most_common()), dict(kernels.most_common())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def lower_step(abstract: Abstract, step: Step) -> StepResult:
    """Lower one step for the plan's platform; a failure is a result, not an exception."""
    start = time.perf_counter()
    try:
        fn, args = BUILDERS[step.builder](abstract, **dict(step.params))
        text = fn.trace(*args).lower(lowering_platforms=(abstract.plan.platform,)).as_text()
    except Exception as e:  # noqa: BLE001 — every failure is reported against its step
        return StepResult(step.name, step.kind, False, time.perf_counter() - start, {}, {}, _first_line(e))
    targets, kernels = custom_calls(text)
    return StepResult(step.name, step.kind, True, time.perf_counter() - start, targets, kernels)


def lower_steps(plan: LowerPlan) -> Iterator[StepResult]:
    """Lower every step of `plan`, in order, one result each as it is done."""
    abstract = Abstract(plan)
    for step in plan.steps:
        yield lower_step(abstract, step)


def lower_all(config, **kwargs) -> list[StepResult]:
    """`plan_lowering(config, **kwargs)`, every step lowered: the results in order."""
    return list(lower_steps(plan_lowering(config, **kwargs)))


def failure(results: list[StepResult]) -> LoweringError | None:
    """The error naming the first failing step (and how many more failed), or None."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return None
    more = f" (and {len(failed) - 1} more: {', '.join(r.name for r in failed[1:])})" if len(failed) > 1 else ""
    return LoweringError(f"{failed[0].name} did not lower: {failed[0].error}{more}")


def report(plan: LowerPlan, results: list[StepResult], seconds: float) -> dict:
    """The one JSON object of `ninfer lower --json`."""
    return {"platform": plan.platform, "backend": plan.backend, "shapes": plan.shapes.as_dict(),
            "steps": [r.as_dict() for r in results], "lowered": sum(r.ok for r in results),
            "failed": [r.name for r in results if not r.ok], "seconds": round(seconds, 3)}


def run(plan: LowerPlan, as_json: bool = False) -> "LoweringError | None":
    """`ninfer lower`'s output: a progress line on stderr, one line per step as it lowers on
    stdout (or, `as_json`, one JSON object at the end), a closing count on stderr. Returns the
    failure to report, None when every step lowered."""
    import json
    import sys

    s = plan.shapes
    n = len(plan.steps)
    print(f"[ninfer] lowering {n} step{'' if n == 1 else 's'} of {s.model} ({s.dtype}) for {plan.platform}, kernels "
          f"{plan.backend}: chunk {s.chunk_size}, decode buckets {','.join(map(str, s.decode_buckets))}, "
          f"speculative_tokens {s.speculative_tokens}, {s.kv_pages} Main KV pages, {s.state_slots} StateImage slots",
          file=sys.stderr)
    start = time.perf_counter()
    results = []
    for result in lower_steps(plan):
        results.append(result)
        if not as_json:
            print(result.line(), flush=True)
    seconds = time.perf_counter() - start
    if as_json:
        print(json.dumps(report(plan, results, seconds), sort_keys=True))
    print(f"[ninfer] lowered {sum(r.ok for r in results)} of {len(results)} steps for {plan.platform} in "
          f"{seconds:.1f}s", file=sys.stderr)
    return failure(results)
