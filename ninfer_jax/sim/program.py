"""A cost-model Program: the real ledger and stores, no model math.

Same interface as `ninfer_jax.program.Program` (the engine's Program contract,
ninfer_jax/engine/contract.py), so the same engine loop (scheduler, permits,
allocation, settlement, sampling, streaming) replays many thousands of requests in seconds.
Pools are one byte per unit; logits are a cheap deterministic function of (token, position),
so outputs are reproducible; time is modelled (`sim_seconds`: steps and copies) rather than
measured, and the source cost model the engine orders sources by is derived from the same
model (`CostModel.rates`, SRC-3) instead of being calibrated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import jax.numpy as jnp
import numpy as np

import ledger
from ninfer_jax.config import EngineConfig
from ninfer_jax.errors import ConfigError
from ninfer_jax.model import builtin
from ninfer_jax.model.config import ModelConfig
from ninfer_jax.model import token_mask
from ninfer_jax.plan import Capacity, CapacityPlan, decode_buckets, plan_capacity
from ninfer_jax.program import calibrate
from ninfer_jax.program.program import DecodeRow
from ninfer_jax.program.stores import ProgramStores
from ninfer_jax.program.unit_pool import UnitPool


@dataclass(frozen=True)
class CostModel:
    """Seconds per step: a fixed launch cost plus a per-token (prefill) or per-row (decode)
    part; and the copy rates of the byte movements plans ask for (bytes per second, of the
    ledger's bytes: one per unit here), charged to the modelled clock."""

    prefill_fixed: float = 2e-3
    prefill_per_token: float = 2e-5
    decode_fixed: float = 1e-3
    decode_per_row: float = 1e-4
    h2d_bytes_per_s: float = 25e9  # pinned Host -> Device over PCIe Gen5 x16, in practice
    d2h_bytes_per_s: float = 25e9
    d2d_bytes_per_s: float = 1e12  # a Device copy reads and writes HBM

    @classmethod
    def load(cls, path: str) -> "CostModel":
        """A cost model from a JSON object of these fields (keys starting with "_" are notes);
        ConfigError naming the file and the field for anything else."""
        import dataclasses
        import json

        from ninfer_jax.errors import ConfigError

        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError("cost", f"{path}: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError("cost", f"{path}: expected a JSON object of {', '.join(cls.fields())}")
        values = {k: v for k, v in raw.items() if not k.startswith("_")}
        unknown = sorted(set(values) - set(cls.fields()))
        if unknown:
            raise ConfigError("cost", f"{path}: unknown field {unknown[0]!r} (the fields are {', '.join(cls.fields())})")
        for k, v in values.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ConfigError("cost", f"{path}: {k} must be a positive number, got {v!r}")
        return dataclasses.replace(cls(), **{k: float(v) for k, v in values.items()})

    @staticmethod
    def fields() -> tuple[str, ...]:
        import dataclasses

        return tuple(f.name for f in dataclasses.fields(CostModel))

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.fields()}

    def rates(self, chunk_size: int) -> calibrate.CostRates:
        """The source cost model a calibration would measure on this Program (SRC-3): the
        modelled chunk time over its tokens and the modelled copy rates, so sources are ordered
        and pause routes chosen as a device with these rates would."""
        return calibrate.sim_rates(self.prefill_fixed, self.prefill_per_token, chunk_size, self.h2d_bytes_per_s,
                                   self.d2h_bytes_per_s, self.d2d_bytes_per_s)


class _SizedPool:
    """A pool the ledger sees at the model's unit size; it keeps no bytes."""

    def __init__(self, pool_id: str, kind: str, capacity: int, unit_bytes: int, page_tokens: int = 0):
        self.pool_id, self.unit_bytes = pool_id, unit_bytes
        self._spec = ledger.PoolSpec(pool_id, kind, capacity, unit_bytes, page_tokens)

    def spec(self) -> ledger.PoolSpec:
        return self._spec


class _NoHostBytes:
    """A Host arena of `capacity` bytes that holds none: the ledger's `HostArena` does all the
    accounting, and nothing here reads bytes back (a 256 GiB arena costs nothing)."""

    def __init__(self, capacity_bytes: int):
        self.capacity = capacity_bytes
        self.guard = None


class _LedgerOnlyStores(ProgramStores):
    """The real ledger over `_SizedPool`s: plans commit and are checked as usual; the byte
    effects are only timed (by the Program), since nothing here ever reads bytes back."""

    arena_cls = _NoHostBytes

    def _run(self, effects) -> None:
        pass


class SimProgram:
    """The cost-model Program (module doc); it implements `ninfer_jax.engine.contract.ProgramContract`."""

    # The contract's optional capabilities (engine/contract.py), none of which it has:
    speculative_tokens = 0  # no speculative decoding (refused at construction)
    step_seconds = None  # no compute clock of its own: the engine times each step call
    model = None  # no weights
    takes_media = False  # no vision tower: image and video input is refused at the boundary

    def __init__(self, config: EngineConfig, model_config: ModelConfig | None = None, cost: CostModel = CostModel(),
                 *, model_bytes: bool = False, capacity: Capacity | None = None, plan: CapacityPlan | None = None):
        """`model_bytes`: the ledger sees the model's real unit sizes (a Main KV page, a
        StateImage, so Host capacity and transfers are in real bytes) and no bytes are stored;
        by default every unit is one byte and moved for real. `plan`: the capacity plan to build
        the pools from (`plan_capacity` of this config on this geometry; with `CacheBytes`, a
        cache byte budget instead of the device solve); default: the device solve. `capacity`:
        these pool sizes instead of a plan (a `CacheSplit.capacity`)."""
        if config.speculative_tokens:
            raise ConfigError("speculative_tokens", "the cost-model Program does not model speculative decoding: use 0")
        self.config = config
        cfg = model_config if model_config is not None else builtin.config()
        self.dtype = self.sim_dtype(config, model_config)
        itemsize = 2 if self.dtype == "bfloat16" else 4
        if plan is None and capacity is None:
            plan = plan_capacity(config, cfg, itemsize)
        if plan is not None and (plan.max_context, plan.max_concurrency) != (config.max_context,
                                                                            config.max_concurrency):
            raise ValueError(f"the plan is for max_context {plan.max_context}, C={plan.max_concurrency}; the config "
                             f"asks {config.max_context}, C={config.max_concurrency}")
        self.plan: CapacityPlan | None = plan
        self.capacity: Capacity = capacity if capacity is not None else plan.capacity
        if model_bytes:
            self.stores = _LedgerOnlyStores(
                [_SizedPool(ledger.MAIN_KV, ledger.KV_PAGES, self.capacity.kv_pages,
                            cfg.kv_bytes_per_token(itemsize) * ledger.PAGE_TOKENS, ledger.PAGE_TOKENS),
                 _SizedPool(ledger.STATE_POOL, ledger.STATE_SLOTS, self.capacity.state_slots,
                            cfg.state_image_bytes(itemsize))],
                self.capacity.host_capacity_bytes)
        else:
            self.stores = ProgramStores(
                [UnitPool(ledger.MAIN_KV, ledger.KV_PAGES, jnp.zeros((self.capacity.kv_pages, 1), jnp.uint8), 64),
                 UnitPool(ledger.STATE_POOL, ledger.STATE_SLOTS, jnp.zeros((self.capacity.state_slots, 1), jnp.uint8))],
                self.capacity.host_capacity_bytes)
        self.vocab_size = cfg.vocab_size
        self._buf, self._set = None, ()  # the logits buffer of `_block` and its set entries
        self.eos_token_ids = tuple(cfg.eos_token_id)
        self.chunk_size = config.chunk_size
        self.decode_buckets = decode_buckets(config.max_concurrency) if plan is None else plan.decode_buckets
        self.cost = cost
        self.cost_source = "given"
        self.cost_model = cost.rates(self.chunk_size)  # SRC-3: what the engine's ledger calls use
        self.sim_seconds = 0.0
        self.compilations = 0
        self.compilations_from_cache = 0
        self.execution_tag = f"sim|{config.model}|{self.dtype}"

    @staticmethod
    def sim_dtype(config: EngineConfig, model_config: ModelConfig | None = None) -> str:
        """"auto" on the sim's model config: the built-in model is float32; a bf16 checkpoint's own
        dtype is read only when the sim is given that checkpoint's config (its folder)."""
        if config.dtype != "auto":
            return config.dtype
        return config.resolved_dtype if model_config is not None and not config.model.startswith("builtin:") \
            else "float32"

    @classmethod
    def geometry(cls, config: EngineConfig) -> tuple[ModelConfig, int]:
        """The model config `for_model` sizes its pools from (the built-in one, or the folder's
        config.json alone) and the bytes per element it sizes them at."""
        if config.model.startswith("builtin:"):
            model = None
        else:
            from ninfer_jax.model.config import load_config

            model = load_config(config.model)
        itemsize = 2 if cls.sim_dtype(config, model) == "bfloat16" else 4
        return (model if model is not None else builtin.config()), itemsize

    @classmethod
    def for_model(cls, config: EngineConfig, cost: CostModel | str | None = None,
                  capacity: Capacity | None = None, plan: CapacityPlan | None = None) -> "SimProgram":
        """The cost-model Program for `config.model`: the built-in model's geometry in one-byte
        units, or any model folder's `config.json` alone (no weights are read) with its real
        unit sizes, vocabulary and eos, and the capacity the real Program would resolve
        (`device_memory_bytes` standing for the device; `ninfer_jax/sim/geometries/` ships
        config-only folders). `cost`: a CostModel or a JSON file of one; by default the
        folder's `cost.json` if it has one, else `CostModel()`. `cost_source` says which.
        `plan`: the capacity plan of `config` on `geometry(config)` to build the pools from
        (`plan_capacity(..., cache_bytes=CacheBytes(N))` for `ninfer trace --cache_device_bytes`;
        the built-in model's pools stay one byte per unit, the counts are what its real bytes give);
        `capacity`: pool sizes instead of a plan."""
        import os

        source = "default"
        if isinstance(cost, str):
            cost, source = CostModel.load(cost), cost
        elif cost is None and not config.model.startswith("builtin:") and os.path.exists(
                os.path.join(config.model, "cost.json")):
            source = os.path.join(config.model, "cost.json")
            cost = CostModel.load(source)
        elif cost is not None:
            source = "given"
        cost = cost or CostModel()
        if config.model.startswith("builtin:"):
            program = cls(config, cost=cost, capacity=capacity, plan=plan)
        else:
            from ninfer_jax.model.config import load_config

            program = cls(config, load_config(config.model), cost, model_bytes=True, capacity=capacity, plan=plan)
        program.cost_source = source
        return program

    @property
    def state(self) -> ledger.LedgerState:
        return self.stores.state

    def commit(self, plan) -> ledger.LedgerState:
        state = self.stores.commit(plan)
        for e in plan.effects:  # the copies take modelled time, at the rates the sources are priced by
            if isinstance(e, ledger.CopyToHost):
                self.sim_seconds += e.nbytes / self.cost.d2h_bytes_per_s
            elif isinstance(e, ledger.CopyToDevice):
                self.sim_seconds += e.nbytes / self.cost.h2d_bytes_per_s
            elif isinstance(e, ledger.CopyUnit):
                self.sim_seconds += self.stores.pools[e.pool].unit_bytes / self.cost.d2d_bytes_per_s
        return state

    def check_integrity(self) -> ledger.Recount:
        return self.stores.check_integrity()

    def warmup(self) -> None:
        pass

    def clock(self) -> float:
        """Modelled seconds: the engine's event times (TTFT...) are on this clock."""
        return self.sim_seconds

    def hidden_logits(self, slot: int, last_token: int = 0, position: int = 0) -> np.ndarray:
        """What the last prefill of `last_token` at `position` would have returned (no hidden
        is kept here), at the cost of one lm-head launch."""
        self.sim_seconds += self.cost.decode_fixed
        return self._logits(last_token, position)

    def _pick(self, token: int, position: int) -> int:
        """The id the cost model's logits favour after `token` at `position`."""
        return (31 * token + 17 * position + 7) % min(self.vocab_size, 1000)

    def _block(self, picks: list[int]) -> np.ndarray:
        """Logits `[len(picks), V]`: 10 at each row's pick, 0 elsewhere. One zeroed buffer is
        kept and only the previous picks are cleared (a real vocabulary is 150k wide: zeroing
        it every cycle was a large part of a replay); the view handed out is read-only and
        valid until the next step, which is as long as the engine reads a step's logits."""
        n = len(picks)
        buf = self._buf
        if buf is None or buf.shape[0] < n:
            buf = self._buf = np.zeros((max(n, self.decode_buckets[-1]), self.vocab_size), np.float32)
            self._set = ()
        for r, c in self._set:  # element by element: fancy indexing cost more than a few rows
            buf[r, c] = 0.0
        done = tuple(enumerate(picks))
        for r, c in done:
            buf[r, c] = 10.0
        self._set = done
        out = buf[:n]
        out.flags.writeable = False
        return out

    def _logits(self, token: int, position: int) -> np.ndarray:
        return self._block([self._pick(token, position)])[0]

    def prefill(self, tokens: Sequence[int], start: int, pages: Sequence[int], slot: int) -> np.ndarray:
        if not 0 < len(tokens) <= self.chunk_size:
            raise ValueError(f"prefill chunk of {len(tokens)} tokens; expected 1..{self.chunk_size}")
        self.sim_seconds += self.cost.prefill_fixed + self.cost.prefill_per_token * self.chunk_size
        return self._logits(tokens[-1], start + len(tokens) - 1)

    def decode(self, rows: Sequence[DecodeRow], masks=None) -> np.ndarray:
        bucket = next(b for b in self.decode_buckets if b >= len(rows))
        self.sim_seconds += self.cost.decode_fixed + self.cost.decode_per_row * bucket
        out = self._block([self._pick(r.token, r.position) for r in rows])
        if masks is not None:  # the rows' token bitmasks, applied as the compiled mask step does
            out = np.where(token_mask.allowed(masks(), out.shape[-1]), out, -np.inf).astype(out.dtype)
        return out
