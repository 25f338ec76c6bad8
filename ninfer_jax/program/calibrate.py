"""The source cost model, calibrated at warm-up on the backend in use (SRC-3).

The ledger ranks recovery sources by `ledger.CostModel(prefill_per_token, h2d_per_byte,
d2d_per_byte)` (SRC-2), and the engine's "auto" pause route compares a Snapshot's copy with a
Replay's recomputation by the same prices (PAUSE-2). Both only compare costs, so any unit will
do as long as it is one unit; the ledger's built-in default (prefill 1 per token, H2D 1e-4 per
byte) is such a guess and it prices the Host tier out on a real model. This module measures
the prices instead, in seconds:

  prefill_s_per_token  the compiled prefill step on the warm-up bucket (one `chunk_size` row),
                       median of a few timed runs after compilation, divided by `chunk_size`
  h2d_bytes_per_s      the Program's own byte movers, Host -> Device: the stores' transfers
                       from the Host arena (as `ProgramStores` runs `CopyToDevice`)
  d2h_bytes_per_s      Device -> Host: the transfers into the arena (as `CopyToHost`)
  d2d_bytes_per_s      Device -> Device (`UnitPool.copy_units`, as `CopyUnit`)

Every move writes back the bytes the units already hold (D2H into the arena's first bytes,
then H2D from there, only while the ledger has no Host extent at all, as at warm-up; otherwise,
or with no room in the arena, the pool's `read_units` / `write_units` and a host buffer stand
in), and the prefill row is the warm-up's padding row (slot -1: it reads zeros and writes
nothing), so calibration changes no content. The prices decide order only (SRC-3): which
source binds first and which pause route is taken; recoverability and the tokens produced
never depend on them (doctrine 1).

`CostRates` carries the rates and where they came from; `CostRates.ledger()` is the ledger's
`CostModel` (seconds per token, seconds per byte). A caller can inject rates instead
(`Engine(cost_model=CostRates(...))`, or `program.cost_model` set before warm-up), or set the
environment variable NINFER_COST_MODEL:
  unset, "", "warmup"   calibrate at warm-up (the default)
  "off", "default"      the ledger's fixed default, unmeasured (the behaviour before calibration)
  "prefill_s_per_token=5e-5,h2d_bytes_per_s=2.5e10,..."   these rates; any of the four fields
                        left out is calibrated
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from typing import NamedTuple

import jax
import numpy as np

import ledger

ENV = "NINFER_COST_MODEL"
PREFILL_RUNS = 5  # timed prefill steps (median)
MOVE_RUNS = 3  # timed runs of each byte move (median)
MOVE_MAX_UNITS = 64  # largest unit batch timed: a page group (HOST-3)
MOVE_MAX_BYTES = 128 << 20  # at most this much per timed move
MIN_SECONDS = 1e-7  # floor of one timed sample: no zero or negative time can reach a rate
MAX_BYTES_PER_S = 1e15  # and no rate beyond this (a floor on seconds per byte)
FIELDS = ("prefill_s_per_token", "h2d_bytes_per_s", "d2h_bytes_per_s", "d2d_bytes_per_s")


class CostRates(NamedTuple):
    """Seconds per prefilled token and bytes per second of each copy direction (SRC-3)."""

    prefill_s_per_token: float
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    d2d_bytes_per_s: float
    calibrated: bool = False  # measured on this backend (True) or given / modelled
    source: str = "injected"  # "warmup" | "injected" | "env" | "warmup+env" | "sim" | "default"
    seconds: float = 0.0  # wall time the calibration took

    def ledger(self) -> ledger.CostModel:
        """The ledger's cost model in seconds: per token, per H2D byte, per Device-copy byte."""
        return ledger.CostModel(float(self.prefill_s_per_token), 1.0 / self.h2d_bytes_per_s,
                                1.0 / self.d2d_bytes_per_s)

    def copy_out_and_back_s(self, nbytes: int) -> float:
        """A Snapshot's copy: `nbytes` to Host and back (PAUSE-2)."""
        return nbytes / self.d2h_bytes_per_s + nbytes / self.h2d_bytes_per_s

    def recompute_s(self, tokens: int) -> float:
        """A Replay's recomputation of `tokens` (PAUSE-2)."""
        return tokens * self.prefill_s_per_token

    def stats(self) -> dict:
        """What `engine.stats()["cost_model"]` reports."""
        out = {f: float(getattr(self, f)) for f in FIELDS}
        out.update(calibrated=bool(self.calibrated), source=self.source, seconds=float(self.seconds),
                   ledger=self.ledger()._asdict())
        return out

    @classmethod
    def from_ledger(cls, cost: ledger.CostModel, source: str = "default") -> "CostRates":
        """A ledger cost model read as seconds (D2H priced as H2D, as the pause route always did)."""
        return cls(cost.prefill_per_token, 1.0 / cost.h2d_per_byte, 1.0 / cost.h2d_per_byte,
                   1.0 / cost.d2d_per_byte if cost.d2d_per_byte > 0 else MAX_BYTES_PER_S, False, source)


DEFAULT = CostRates.from_ledger(ledger.CostModel())  # the ledger's fixed default, unmeasured


def checked(rates: CostRates) -> CostRates:
    """`rates` if every field is a positive finite number; else ValueError."""
    if not isinstance(rates, CostRates):
        raise ValueError(f"cost_model: expected a CostRates, got {type(rates).__name__}")
    for f in FIELDS:
        v = getattr(rates, f)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"cost_model.{f} must be a positive finite number, got {v!r}")
    return rates


def rates_of(program) -> CostRates:
    """The rates a Program carries (`program.cost_model`); the ledger's default for one without."""
    got = getattr(program, "cost_model", None)
    return got if isinstance(got, CostRates) else DEFAULT


def host_break_even_tokens(cost: ledger.CostModel, state_bytes: int, kv_bytes_per_token: float,
                           kv_on_host: bool = True) -> float:
    """Reused tokens beyond which a Host-resident source beats recomputing from root under
    `cost` (SRC-2's sum): n * p > S * h + n * k * h, so n > S * h / (p - k * h) when the KV is
    on Host too (k = KV bytes per token), n > S * h / p when only the StateImage is; inf when
    reading a token's KV back costs at least its recomputation."""
    h, p = cost.h2d_per_byte, cost.prefill_per_token
    per_token = p - (kv_bytes_per_token * h if kv_on_host else 0.0)
    return state_bytes * h / per_token if per_token > 0 else math.inf


# ---- from the environment ---------------------------------------------------------------------
def from_env(value: str | None = None) -> tuple[str, dict]:
    """(mode, fields) from NINFER_COST_MODEL: ("warmup", {}), ("off", {}) or ("set", {field: v})."""
    raw = (os.environ.get(ENV, "") if value is None else value).strip()
    if raw.lower() in ("", "warmup", "on"):
        return "warmup", {}
    if raw.lower() in ("off", "default"):
        return "off", {}
    fields = {}
    for part in raw.split(","):
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep or key not in FIELDS:
            raise ValueError(f"{ENV}: expected warmup, off, or {'=..,'.join(FIELDS)}=..; got {part!r}")
        try:
            fields[key] = float(val)
        except ValueError:
            raise ValueError(f"{ENV}: {key}={val!r} is not a number") from None
    return "set", fields


# ---- measuring --------------------------------------------------------------------------------
def _median_seconds(fn, runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(max(time.perf_counter() - t0, MIN_SECONDS))
    return statistics.median(samples)


def _rate(nbytes: int, seconds: float) -> float:
    return min(nbytes / max(seconds, MIN_SECONDS), MAX_BYTES_PER_S)


def measure_prefill(program, runs: int = PREFILL_RUNS) -> float:
    """Seconds per token of the compiled prefill step on the warm-up bucket: the padding row
    (slot -1, nothing written), numpy in and logits out as `Program.prefill` does it; median."""
    chunk = program.chunk_size
    args = (np.zeros((1, chunk), np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32),
            np.zeros((1, program.capacity.pages_per_request), np.int32), np.full(1, -1, np.int32))
    state_pool = program.stores.pools[ledger.STATE_POOL]

    def step():
        logits = program._run("prefill", *args)
        np.asarray(logits)
        jax.block_until_ready(state_pool.tree)

    return max(_median_seconds(step, runs) / chunk, MIN_SECONDS / chunk)


def _sizes(pool) -> list[int]:
    """Unit counts timed for one pool: one unit (a StateImage, a page) and the largest
    power-of-two batch within MOVE_MAX_UNITS and MOVE_MAX_BYTES (a page group); every
    power-of-two bucket up to the pool's size is compiled at warm-up."""
    top = max(1, min(pool.capacity, MOVE_MAX_UNITS, MOVE_MAX_BYTES // max(pool.unit_bytes, 1)))
    top = 1 << (top.bit_length() - 1)
    return sorted({1, top})


def _movers(stores, pool, k: int):
    """(D2H, H2D, D2D) moves of units 0..k-1 that leave their bytes as they are. Through the
    stores' own transfers into the Host arena's first bytes when the ledger has no Host extent
    at all (as at warm-up: nothing there is anyone's, doctrine 1) and the arena has room, else
    through the pool's movers and a host buffer of the same size."""
    units = list(range(k))
    transfers, arena = getattr(stores, "transfers", None), getattr(stores, "arena", None)
    state = getattr(stores, "state", None)
    host_free = state is not None and state.arena.used_bytes == 0 and not getattr(transfers, "pending", ())
    if transfers is not None and arena is not None and host_free and k * pool.unit_bytes <= arena.capacity:
        offsets = [i * pool.unit_bytes for i in units]

        def d2h():  # CopyToHost: pack on device, to host memory, into the arena
            transfers.d2h(pool, units, offsets, None)
            transfers.finish()

        def h2d():  # CopyToDevice: the arena's bytes to device, unpacked into the units
            transfers.h2d(pool, units, offsets, None)
            transfers.finish()
            jax.block_until_ready(pool.tree)

        d2h()  # the arena holds the units' own bytes before anything is written back
    else:
        data = pool.read_units(units)  # the bytes written back below
        scratch = np.empty_like(data)

        def d2h():
            scratch[...] = pool.read_units(units)

        def h2d():
            pool.write_units(units, np.copy(data))
            jax.block_until_ready(pool.tree)

    def d2d():  # CopyUnit (each unit onto itself)
        pool.copy_units(units, units)
        jax.block_until_ready(pool.tree)

    return d2h, h2d, d2d


def measure_moves(stores, runs: int = MOVE_RUNS) -> tuple[float, float, float]:
    """(H2D, D2H, D2D) bytes per second of the stores' byte movers over every pool and a few
    batch sizes: total bytes over the sum of the median times. No unit changes content."""
    moved = {"h2d": [0, 0.0], "d2h": [0, 0.0], "d2d": [0, 0.0]}
    for pool in stores.pools.values():
        for k in _sizes(pool):
            d2h, h2d, d2d = _movers(stores, pool, k)
            for key, fn in (("d2h", d2h), ("h2d", h2d), ("d2d", d2d)):
                moved[key][0] += k * pool.unit_bytes
                moved[key][1] += _median_seconds(fn, runs)
    return tuple(_rate(*moved[k]) for k in ("h2d", "d2h", "d2d"))


def calibrate(program, *, env: str | None = None) -> CostRates:
    """The cost model for a warmed-up Program (its steps compiled): measured here, unless
    NINFER_COST_MODEL says otherwise (module doc). Prints one progress line when the Program's
    config asks for progress."""
    mode, fields = from_env(env)
    if mode == "off":
        return DEFAULT
    if mode == "set" and len(fields) == len(FIELDS):
        return checked(CostRates(**fields, calibrated=False, source="env"))
    t0 = time.perf_counter()
    prefill = measure_prefill(program)
    h2d, d2h, d2d = measure_moves(program.stores)
    got = dict(prefill_s_per_token=prefill, h2d_bytes_per_s=h2d, d2h_bytes_per_s=d2h, d2d_bytes_per_s=d2d)
    got.update(fields)
    rates = checked(CostRates(**got, calibrated=True, source="warmup+env" if fields else "warmup",
                              seconds=time.perf_counter() - t0))
    if getattr(program.config, "progress", False):
        print(f"[ninfer] {progress_line(rates)}", file=sys.stderr)
    return rates


def progress_line(r: CostRates) -> str:
    return (f"calibrated: prefill {r.prefill_s_per_token * 1e6:.3g} µs/token, H2D {r.h2d_bytes_per_s / 1e9:.3g} GB/s, "
            f"D2H {r.d2h_bytes_per_s / 1e9:.3g} GB/s, D2D {r.d2d_bytes_per_s / 1e9:.3g} GB/s "
            f"({r.seconds * 1e3:.0f} ms)")


def sim_rates(prefill_fixed_s: float, prefill_s_per_token: float, chunk_size: int, h2d_bytes_per_s: float,
              d2h_bytes_per_s: float, d2d_bytes_per_s: float) -> CostRates:
    """The rates a calibration would measure on the cost-model Program: its chunk time
    (fixed + per token × the padded chunk) over the chunk's tokens, and its modelled copy rates."""
    per_token = (prefill_fixed_s + prefill_s_per_token * chunk_size) / chunk_size
    return checked(CostRates(per_token, h2d_bytes_per_s, d2h_bytes_per_s, d2d_bytes_per_s, False, "sim"))
