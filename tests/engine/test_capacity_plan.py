"""CFG-2, CFG-6: the capacity plan from the device's memory (ninfer_jax/plan/budget.py).

The expected figures are derived here from the public geometry of Qwen3-Next-80B-A3B, written
out below, never copied from the plan's output. The config-only fixture folder holds that
model's config.json and no weights.
"""
import functools
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ninfer_jax import ContextCacheConfig, EngineConfig
from ninfer_jax.errors import ConfigError
from ninfer_jax.model import builtin, load_model
from ninfer_jax.model.config import load_config
from ninfer_jax.plan import plan_capacity, resolve_capacity, step_workspace_bytes
from ninfer_jax.program import device_memory

ROOT = Path(__file__).resolve().parents[2]
NEXT_80B = str(ROOT / "tests" / "fixtures" / "configs" / "qwen3_next_80b_a3b")
GIB, MIB = 1 << 30, 1 << 20

# Qwen3-Next-80B-A3B's geometry (its config.json): 48 layers, every fourth full attention.
H, V, LAYERS = 2048, 151936, 48
N_ATTN, N_LIN = 12, 36
HQ, HKV, D = 16, 2, 256  # attention heads, KV heads, head_dim
HK, HV, DK, DV, KERNEL = 16, 32, 128, 128, 4  # GDN key/value heads and dims, conv kernel
E, TOP_K, I_MOE, I_SHARED = 512, 10, 512, 512
CONV = 2 * HK * DK + HV * DV  # the conv runs over [q | k | v]
BF16 = 2

MOE = H * E + 3 * E * H * I_MOE + 3 * H * I_SHARED + H  # router, experts, shared expert and its gate
LINEAR_MIXER = H * (CONV + HV * DV + 2 * HV) + CONV * KERNEL + 2 * HV + DV + HV * DV * H
ATTENTION_MIXER = H * (2 * HQ * D + 2 * HKV * D) + HQ * D * H + 2 * D
PARAMS = 2 * V * H + H + N_LIN * (LINEAR_MIXER + MOE + 2 * H) + N_ATTN * (ATTENTION_MIXER + MOE + 2 * H)
STATE_IMAGE = N_LIN * ((KERNEL - 1) * CONV * BF16 + 4 * HV * DK * DV) + H * BF16  # conv + float32 recurrent + hidden
PAGE = 64 * 2 * N_ATTN * HKV * D * BF16  # one 64-token Main KV page, K and V over the attention layers


def _model():
    return load_config(NEXT_80B)


def _config(**kw):
    base = dict(model=NEXT_80B, max_concurrency=8, max_context=32768, progress=False)
    base.update(kw)
    return EngineConfig(**base)


def _decode_workspace(rows, context):
    """The documented workspace of one decode bucket (backend xla), term by term."""
    width = 4 * H + max(CONV + 3 * HV * DV + 2 * HV + 2 * HV * DK, 3 * HQ * D + 2 * HKV * D) + (
        E + TOP_K * (2 * H + 2 * I_MOE) + 2 * I_SHARED)
    s = context  # pages per request × 64
    return (rows * width * 4 + rows * V * (BF16 + 4) + rows * 2 * (HV * DK * DV * 4 + (KERNEL - 1) * CONV * BF16)
            + rows * 2 * s * HKV * D * 4 + 3 * HQ * 1 * s * 4 + (2 * s * HKV * D * 4 if rows > 1 else 0))


def test_80b_geometry_parameter_count_and_sizes():
    model = _model()
    # One linear-attention layer with its MoE block: the count transformers gives for such a layer.
    assert LINEAR_MIXER + MOE + 2 * H == 1_648_531_648
    assert model.param_count() == PARAMS == 79_674_391_296
    assert model.weights_bytes(BF16) == PARAMS * 2
    assert 148 * GIB < PARAMS * 2 < 149 * GIB
    assert model.state_image_bytes(BF16) == STATE_IMAGE
    assert model.kv_bytes_per_token(BF16) * 64 == PAGE


def test_param_count_is_the_builtin_models_real_parameter_count():
    cfg = builtin.config()
    real = sum(leaf.size for leaf in jax.tree.leaves(load_model(builtin.NAME).params))  # mtp.* not counted
    assert cfg.param_count() == real
    assert 230_000 < real < 236_000  # "about 233 thousand parameters" (README)


@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"])
def test_param_count_matches_the_oracle_checkpoints_safetensors(kind):
    folder = ROOT / "tests" / "fixtures" / "oracle" / kind
    with open(folder / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    assert {t["dtype"] for t in header.values()} == {"F32"}
    elements = sum(math.prod(t["shape"]) for t in header.values())
    data = max(t["data_offsets"][1] for t in header.values())
    model = load_config(str(folder))
    assert model.param_count() == elements
    assert model.weights_bytes(4) == data


def test_cfg2_80b_at_192_gib_solves_to_the_cfg6_upper_bound():
    device = 192 * GIB
    plan = plan_capacity(_config(device_memory_bytes=device), _model(), BF16)
    usable = device * 9 // 10  # device_memory_fraction 0.9
    workspace = _decode_workspace(8, 32768)  # the 8-row decode step is the largest
    assert 512 * PAGE + STATE_IMAGE < workspace  # one request's whole context packed for the Host
    # prefill at 5 page-table widths (2..512 pages: xla reads its whole table) + 3 decode buckets,
    # + head/movers/backend
    compiled = 8 * (16 + LAYERS) * MIB + 64 * MIB
    room = usable - PARAMS * 2 - workspace - compiled - 16 * STATE_IMAGE
    assert room // PAGE > 8 * 512  # more than C full contexts fit: CFG-6 caps the Main KV

    assert plan.source == "device_memory_bytes" and plan.charged
    assert plan.usable_bytes == usable == 185_542_587_187
    assert plan.weights_bytes == PARAMS * 2
    assert (plan.state_slots, plan.state_slot_bytes) == (16, STATE_IMAGE)
    assert plan.workspace.store_bytes == 512 * PAGE + STATE_IMAGE
    assert plan.workspace.bytes == plan.workspace.decode_bytes == workspace
    assert plan.compiled_step_bytes == compiled
    assert plan.backend_pool_bytes == 0
    assert (plan.kv_pages, plan.kv_tokens, plan.kv_bytes) == (4096, 262_144, 4096 * PAGE)
    assert plan.kv_limited_by == "CFG-6 upper bound" and plan.kv_page_range == (512, 4096)
    assert plan.free_bytes == room - 4096 * PAGE
    assert plan.host_arena_bytes == 8 * GIB + 8 * STATE_IMAGE
    assert plan.capacity == resolve_capacity(_config(device_memory_bytes=device), _model(), BF16)


def test_cfg2_a_smaller_fraction_makes_device_memory_the_limit():
    device = 192 * GIB
    plan = plan_capacity(_config(device_memory_bytes=device, device_memory_fraction=0.8), _model(), BF16)
    usable = device * 8 // 10
    room = usable - PARAMS * 2 - 16 * STATE_IMAGE - _decode_workspace(8, 32768) - (8 * (16 + LAYERS) + 64) * MIB
    assert 512 < room // PAGE < 4096
    assert plan.kv_pages == room // PAGE and plan.kv_limited_by == "device memory"
    assert 0 <= plan.free_bytes < PAGE


def test_cfg6_80b_at_141_gib_is_refused_on_the_weights():
    with pytest.raises(ConfigError) as e:
        plan_capacity(_config(device_memory_bytes=141 * GIB), _model(), BF16)
    assert e.value.field == "device_memory_bytes"
    text = str(e.value)
    assert f"the weights alone need {PARAMS * 2:,} B (148.41 GiB" in text
    assert f"the device budget is {141 * GIB * 9 // 10:,} B" in text and "0.9 × 151,397,597,184 B" in text


def test_cfg6_a_main_kv_lower_bound_that_cannot_fit_names_kv_capacity():
    # One request of 2M tokens needs 32768 pages (48 GiB) alone; backend pallas keeps the
    # page-table gathers (whose size grows with max_context) out of the workspace.
    cfg = _config(device_memory_bytes=192 * GIB, max_concurrency=1, max_context=1 << 21, backend="pallas")
    with pytest.raises(ConfigError, match="cannot hold the CFG-6 lower bound of 32768 Main KV pages") as e:
        plan_capacity(cfg, _model(), BF16)
    assert e.value.field == "kv_capacity" and f"weights {PARAMS * 2} B" in str(e.value)


def test_cfg6_an_explicit_kv_capacity_must_fit_the_device():
    cfg = _config(device_memory_bytes=192 * GIB, device_memory_fraction=0.8)
    fits = plan_capacity(cfg, _model(), BF16).kv_pages
    assert plan_capacity(_config(device_memory_bytes=192 * GIB, device_memory_fraction=0.8, kv_capacity=fits * 64),
                         _model(), BF16).kv_limited_by == "kv_capacity"
    with pytest.raises(ConfigError, match=r"exceeds the budget \d+ B by") as e:
        plan_capacity(_config(device_memory_bytes=192 * GIB, device_memory_fraction=0.8,
                              kv_capacity=(fits + 1) * 64), _model(), BF16)
    assert e.value.field == "kv_capacity"


def test_pallas_drops_the_page_table_gathers_from_the_workspace():
    xla = plan_capacity(_config(device_memory_bytes=192 * GIB), _model(), BF16).workspace
    pallas = plan_capacity(_config(device_memory_bytes=192 * GIB, backend="pallas"), _model(), BF16).workspace
    gathers = 8 * 2 * 32768 * HKV * D * 4 + 3 * HQ * 32768 * 4 + 2 * 32768 * HKV * D * 4  # row by row: one row's scores
    assert xla.decode_bytes - pallas.decode_bytes == gathers


@pytest.mark.parametrize("value", [0, -0.5, 1.0001, 2, float("nan"), float("inf"), True, "0.9", None])
def test_device_memory_fraction_must_lie_in_0_1(value):
    with pytest.raises(ConfigError) as e:
        EngineConfig(device_memory_fraction=value)
    assert e.value.field == "device_memory_fraction"


@pytest.mark.parametrize("value", [1, 0.5, 1.0, 1e-3])
def test_device_memory_fraction_accepts_0_1(value):
    assert EngineConfig(device_memory_fraction=value).device_memory_fraction == value


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "1GiB"])
def test_device_memory_bytes_must_be_a_positive_int(value):
    with pytest.raises(ConfigError) as e:
        EngineConfig(device_memory_bytes=value)
    assert e.value.field == "device_memory_bytes"


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("field", ["max_concurrency", "max_context", "kv_capacity", "chunk_size", "device_memory_bytes",
                                   "max_queue", "speculative_tokens", "context_cache.device_state_slots",
                                   "context_cache.host_capacity_bytes"])
def test_a_bool_is_refused_where_an_int_is_configured(field, value):
    # A Python bool is an int: kv_capacity=True must not be read as one token.
    with pytest.raises(ConfigError, match=f"^{field}: must be an int, got the bool {value}$") as e:
        if field.startswith("context_cache."):
            ContextCacheConfig(**{field.split(".")[1]: value})
        else:
            EngineConfig(**{field: value})
    assert e.value.field == field


def test_ints_are_still_accepted_where_bools_are_refused():
    config = EngineConfig(max_concurrency=1, max_context=2, kv_capacity=1, chunk_size=1, device_memory_bytes=1,
                          max_queue=1, speculative_tokens=0, progress=False,
                          context_cache=ContextCacheConfig(device_state_slots=0, host_capacity_bytes=0, enabled=False))
    assert (config.kv_capacity, config.speculative_tokens, config.context_cache.device_state_slots) == (1, 0, 0)


class FakeDevice:
    """A device as JAX shows it: memory_stats(), platform, device_kind."""

    platform = "gpu"
    device_kind = "Fake H200"

    def __init__(self, stats):
        self._stats = stats
        self.asked = 0

    def memory_stats(self):
        self.asked += 1
        if isinstance(self._stats, Exception):
            raise self._stats
        return self._stats

    def __str__(self):
        return "cuda:0"


def test_query_reads_memory_stats_of_the_first_local_device(monkeypatch):
    fake = FakeDevice({"bytes_limit": 192 * GIB, "bytes_in_use": 12345, "peak_bytes_in_use": 99})
    monkeypatch.setattr(jax, "local_devices", lambda *a, **k: [fake])
    mem = device_memory.query()
    assert (mem.device, mem.platform, mem.kind) == ("cuda:0", "gpu", "Fake H200")
    assert (mem.bytes_limit, mem.bytes_in_use, mem.has_stats) == (192 * GIB, 12345, True)
    for stats in (None, NotImplementedError("no stats"), {}, {"bytes_limit": -1}, {"bytes_limit": True}):
        assert not device_memory.describe(FakeDevice(stats)).has_stats


def test_cfg2_the_queried_device_charges_what_others_hold(monkeypatch):
    """bytes_limit is the device; bytes_in_use less this engine's resident weights is charged."""
    others = 3 * PAGE + 5
    fake = FakeDevice({"bytes_limit": 192 * GIB, "bytes_in_use": PARAMS * 2 + others})
    monkeypatch.setattr(jax, "local_devices", lambda *a, **k: [fake])
    cfg = _config(device_memory_fraction=0.8)
    plan = plan_capacity(cfg, _model(), BF16, resident_bytes=PARAMS * 2)
    flag = plan_capacity(_config(device_memory_fraction=0.8, device_memory_bytes=192 * GIB), _model(), BF16)
    assert fake.asked == 1 and plan.source == "memory_stats" and plan.device == "cuda:0"
    assert plan.in_use_charged_bytes == others and plan.usable_bytes == flag.usable_bytes - others
    assert flag.kv_limited_by == "device memory"  # so 3 pages and 5 B less room is 3 or 4 pages fewer
    assert plan.kv_pages == (flag.kv_pages * PAGE + flag.free_bytes - others) // PAGE
    assert flag.kv_pages - 4 <= plan.kv_pages <= flag.kv_pages - 3
    # Before the weights are loaded (preflight, ninfer plan) nothing of them is in use yet.
    fake._stats = {"bytes_limit": 192 * GIB, "bytes_in_use": 0}
    assert resolve_capacity(cfg, _model(), BF16) == flag.capacity


def test_cfg2_device_memory_bytes_is_used_without_asking_the_device(monkeypatch):
    def no_query(*a, **k):
        raise AssertionError("the device was asked")

    monkeypatch.setattr(jax, "local_devices", no_query)
    plan = plan_capacity(_config(device_memory_bytes=192 * GIB), _model(), BF16)
    assert plan.source == "device_memory_bytes" and plan.device_in_use_bytes is None


@pytest.mark.parametrize("stats", [None, NotImplementedError("cpu")])
def test_cfg2_a_device_without_statistics_keeps_the_1_gib_default(monkeypatch, stats):
    """The CPU behaviour: the pools get 1 GiB; weights, workspace, compiled steps are not charged."""
    monkeypatch.setattr(jax, "local_devices", lambda *a, **k: [FakeDevice(stats)])
    cfg = builtin.config()
    plan = plan_capacity(EngineConfig(progress=False), cfg, 4)
    assert plan.source == "default" and not plan.charged and plan.budget_bytes == GIB
    assert (plan.kv_pages, plan.state_slots, plan.pages_per_request) == (4 * 32, 8, 32)  # C × ceil(2048/64)
    assert plan.free_bytes == GIB - 128 * cfg.kv_bytes_per_token(4) * 64 - 8 * cfg.state_image_bytes(4)
    # Qwen3-Next's sixteen StateImages alone exceed the default budget at C=8.
    with pytest.raises(ConfigError) as e:
        plan_capacity(_config(), _model(), BF16)
    assert e.value.field == "kv_capacity" and f"16 StateImage slots × {STATE_IMAGE} B" in str(e.value)
    # An explicit capacity is not held to the default budget (a CPU run may ask for more).
    big = EngineConfig(progress=False, max_concurrency=8, max_context=1 << 20, kv_capacity=8 << 20)
    assert plan_capacity(big, cfg, 4).kv_pages == (8 << 20) // 64


def test_program_charges_its_own_weights_once(monkeypatch):
    """The Program resolves its capacity after loading the weights: it passes their bytes."""
    from ninfer_jax.program import program as program_module

    seen = {}

    def spy(config, model, itemsize, **kw):
        seen.update(kw, itemsize=itemsize)
        return plan_capacity(config, model, itemsize, **kw)

    monkeypatch.setattr(program_module, "plan_capacity", spy)
    program = program_module.Program(EngineConfig(progress=False, max_concurrency=1, max_context=128))
    cfg = builtin.config()
    assert seen == {"resident_bytes": cfg.weights_bytes(4), "itemsize": 4}
    assert program.capacity.kv_pages == 2


@pytest.mark.parametrize("max_context", [8192])
def test_workspace_estimate_bounds_xla_memory_analysis(max_context):
    """The formula is an upper estimate of what XLA reserves for the built-in model's steps
    (float32 on CPU, dense feed-forward: no ragged_dot), and not a wild one."""
    from ninfer_jax.model.steps import decode_step, prefill_chunk
    from ninfer_jax.model.weights import param_shapes

    cfg = builtin.config()
    s = jax.ShapeDtypeStruct
    f32, i32 = jnp.float32, jnp.int32
    shapes = param_shapes(cfg)
    params = {k: s(v, f32) for k, v in shapes.items() if k != "layers"}
    params["layers"] = [{k: s(v, f32) for k, v in layer.items()} for layer in shapes["layers"]]
    per_request, slots = max_context // 64, 16
    kv_shape = (8 * per_request, 64, cfg.num_key_value_heads, cfg.head_dim)
    kv = {"k": (s(kv_shape, f32),), "v": (s(kv_shape, f32),)}
    state = {"conv": tuple(s((slots, cfg.linear_conv_kernel_dim - 1, cfg.conv_dim), f32) for _ in range(3)),
             "recurrent": tuple(s((slots, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                   cfg.linear_value_head_dim), f32) for _ in range(3)),
             "hidden": s((slots, cfg.hidden_size), f32)}

    def temp(fn, *args):
        jitted = jax.jit(functools.partial(fn, cfg=cfg, backend="xla"), donate_argnums=(1, 2))
        return jitted.lower(params, kv, state, *args).compile().memory_analysis().temp_size_in_bytes

    decode = temp(decode_step, s((8,), i32), s((8,), i32), s((8, per_request), i32), s((8,), i32))
    prefill = temp(prefill_chunk, s((1, 64), i32), s((1,), i32), s((1,), i32), s((1, per_request), i32),
                   s((1,), i32))
    for measured, estimate in ((decode, step_workspace_bytes(cfg, 8, 1, per_request, 4, "xla")),
                               (prefill, step_workspace_bytes(cfg, 1, 64, per_request, 4, "xla"))):
        assert measured <= estimate <= 1.25 * measured, (measured, estimate)


def test_cfg4_device_state_slots_are_charged_to_the_budget():
    base = plan_capacity(_config(device_memory_bytes=192 * GIB, device_memory_fraction=0.8), _model(), BF16)
    more = plan_capacity(_config(device_memory_bytes=192 * GIB, device_memory_fraction=0.8,
                                 context_cache=ContextCacheConfig(device_state_slots=12)), _model(), BF16)
    assert more.state_slots == 20
    assert more.kv_pages == (base.kv_pages * PAGE + base.free_bytes - 4 * STATE_IMAGE) // PAGE < base.kv_pages


def test_a_device_can_be_passed_in():
    gpu = FakeDevice({"bytes_limit": 192 * GIB, "bytes_in_use": 0})
    plan = plan_capacity(_config(), _model(), BF16, device=gpu)
    assert gpu.asked == 1 and plan.source == "memory_stats" and plan.kv_pages == 4096
    assert plan_capacity(_config(), _model(), BF16, device=device_memory.describe(gpu)).capacity == plan.capacity


# ---- one plan, every consumer (issue 38): the cache byte budget and the Programs read the plan -------
@pytest.mark.parametrize("n, split, given, longest, skip", [
    (16 * GIB, None, True, None, False), (16 * GIB, 0.3, True, None, False), (16 * GIB, 0.1, False, 40_000, False),
    (64 * GIB, None, False, None, False), (2 * GIB, 0.5, False, 200_000, True)])
def test_a_cache_byte_budget_plan_holds_the_split_trace_sizes_its_pools_by(n, split, given, longest, skip):
    """`plan_capacity(..., cache_bytes=CacheBytes(N))`: the pools, max_context and split are
    `split_cache_bytes`' for N (what `ninfer trace --cache_device_bytes` replays with), the Host
    arena the device solve's; the device is not asked and weights etc. are not charged."""
    from ninfer_jax.plan import CacheBytes, split_cache_bytes

    config = _config(max_concurrency=4, max_context=32768 if given else 2048)
    plan = plan_capacity(config, _model(), BF16, device=object(), cache_bytes=CacheBytes(
        n, split=split, max_context_given=given, longest_request=longest, skip_too_long=skip))
    alone = split_cache_bytes(_model(), BF16, n, 4, split=split, max_context=32768 if given else None,
                              longest_request=longest, fallback_max_context=2048, skip_too_long=skip)
    assert plan.cache == alone and plan.source == "cache_device_bytes" and not plan.charged
    assert plan.capacity == alone.capacity(8 * GIB + 8 * STATE_IMAGE)
    assert (plan.max_context, plan.kv_limited_by, plan.budget_bytes) == (alone.max_context, alone.limited_by, n)
    assert plan.charged_bytes == alone.used_bytes and plan.free_bytes == alone.unused_bytes
    assert plan.reasons()["cache bytes"] == alone.text() and "--cache_device_bytes" in plan.text()


def test_a_cache_byte_budget_that_cannot_be_split_is_refused_as_trace_refuses_it():
    from ninfer_jax.plan import CacheBytes, split_cache_bytes

    with pytest.raises(ConfigError) as alone:
        split_cache_bytes(_model(), BF16, GIB, 8, max_context=32768)
    with pytest.raises(ConfigError) as planned:
        plan_capacity(_config(), _model(), BF16, cache_bytes=CacheBytes(GIB))
    assert (planned.value.field, str(planned.value)) == (alone.value.field, str(alone.value))


def test_each_figure_has_its_reason_and_the_buckets_are_the_plans():
    plan = plan_capacity(_config(device_memory_bytes=192 * GIB, device_memory_fraction=0.8), _model(), BF16)
    reasons = plan.reasons()
    assert set(reasons) >= {"device memory", "usable", "weights", "Main KV", "StateImage slots", "backend pools",
                            "workspace", "compiled steps", "free", "Host arena", "default split"}
    assert "device memory" in reasons["Main KV"] and "CFG-6 range 512..4,096 pages" in reasons["Main KV"]
    assert plan.decode_buckets == (2, 4, 8) and plan.workspace.decode_rows == 8
    assert plan.prefill_widths == (2, 8, 32, 128, 512)  # a quarter each, down to one 64-token chunk's pages
    assert plan.compiled_step_programs == len(plan.prefill_widths) + len(plan.decode_buckets)
    pallas = plan_capacity(_config(backend="pallas", device_memory_bytes=192 * GIB), _model(), BF16)
    assert pallas.prefill_widths == (512,)  # the kernels read only the pages a row holds


def test_the_programs_build_their_pools_from_the_plan():
    """The Program and the cost-model Program keep the plan they were sized by and read their
    pools and decode buckets from it; a plan for other sizes than the config's is refused."""
    from ninfer_jax.plan import CacheBytes
    from ninfer_jax.program.program import Program
    from ninfer_jax.sim import SimProgram

    config = EngineConfig(progress=False, max_concurrency=1, max_context=128)
    program = Program(config)
    assert program.capacity == program.plan.capacity and program.decode_buckets == program.plan.decode_buckets == (2,)
    sim = SimProgram(EngineConfig(progress=False, max_concurrency=3))
    assert sim.capacity == sim.plan.capacity and sim.decode_buckets == sim.plan.decode_buckets == (2, 4)
    cfg = builtin.config()
    plan = plan_capacity(EngineConfig(progress=False), cfg, 4, cache_bytes=CacheBytes(1 << 22, split=0.25))
    sized = SimProgram(EngineConfig(progress=False, max_context=plan.max_context), plan=plan)
    assert sized.plan is plan and sized.capacity == plan.capacity
    assert sized.state.pools["main_kv"].spec.capacity == plan.kv_pages
    with pytest.raises(ValueError, match="the plan is for max_context"):
        SimProgram(EngineConfig(progress=False, max_context=plan.max_context + 64), plan=plan)
