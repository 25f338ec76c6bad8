"""The Program contract: everything the engine asks of a Program, in one place.

Two Programs implement it: `ninfer_jax.program.Program` (the model's math on the device pools)
and `ninfer_jax.sim.SimProgram` (the cost model: the real ledger and stores, no model math).
The engine reads nothing else of them, and probes for nothing: what only some Programs can do is
declared by every Program as a member with an explicit "not here" value —

    speculative_tokens  drafts per Verify unit; 0 for a Program without an MTP head or without
                        speculative decoding (the engine then never calls the `Speculative` steps);
    step_seconds        the Program's own count of time inside its compiled steps; None when it
                        keeps none (the engine then times each call itself, `_compute`);
    model               the loaded model; None for a Program without weights (the cost model);
    takes_media         whether its steps take images and videos (a vision tower); False: the
                        engine refuses media at the boundary.

A Program that `takes_media` prefills with the chunk's media inputs (`media=`, engine/media.py),
decodes rows with their rotary position (`DecodeRow.rope`) and runs the tower (`encode_media`).

A Program whose `speculative_tokens` is above 0 is also `Speculative`: its prefill takes the
chunk's MTP pages, and `spec_decode` / `spec_commit` run and commit Verify units (issue 17).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

if TYPE_CHECKING:
    import numpy as np

    import ledger
    from ninfer_jax.config import EngineConfig
    from ninfer_jax.plan import Capacity
    from ninfer_jax.program.calibrate import CostRates
    from ninfer_jax.program.program import DecodeRow
    from ninfer_jax.program.stores import ProgramStores


class ProgramContract(Protocol):
    """What the engine (core, cache policy, transactions, preemption, integrity, `Engine`) uses."""

    # ---- what it is ----------------------------------------------------------------------
    config: EngineConfig
    capacity: Capacity  # the resolved pools (kv_pages, state_slots, ...)
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    chunk_size: int  # tokens per prefill chunk
    dtype: str  # the resolved dtype
    execution_tag: str  # model, dtype, backend: state from another execution is never adopted (CKP-4)
    cost_model: CostRates | None  # SRC-3: the source cost model (None until warm-up calibrates one)
    compilations: int
    compilations_from_cache: int
    # ---- optional capabilities, declared by every Program (module doc) -------------------
    speculative_tokens: int
    step_seconds: float | None
    model: Any  # ninfer_jax.model.model.Model, or None
    takes_media: bool

    # ---- the ledger and the stores -------------------------------------------------------
    stores: ProgramStores  # pools, Host arena, transfers (poll, copies_done, wait, ...)

    @property
    def state(self) -> ledger.LedgerState: ...

    def commit(self, plan: ledger.Plan) -> ledger.LedgerState: ...

    def check_integrity(self) -> ledger.Recount: ...

    def clock(self) -> float:
        """The clock request events (TTFT, gaps, ...) are stamped with."""

    def warmup(self) -> None: ...

    # ---- the steps -----------------------------------------------------------------------
    def prefill(self, tokens: Sequence[int], start: int, pages: Sequence[int], slot: int) -> np.ndarray:
        """One prefill chunk from frontier `start`; logits `[V]` of its last token."""

    def decode(self, rows: Sequence[DecodeRow], masks=None) -> np.ndarray:
        """One decode step for each row; logits `[len(rows), V]`. `masks`: None, or called once
        the step is under way for the rows' token bitmasks (model/token_mask.py), which the
        logits come back held to (structured output)."""

    def hidden_logits(self, slot: int, last_token: int = 0, position: int = 0) -> np.ndarray:
        """Logits `[V]` from a StateImage's continuation hidden (an exact hit's first token)."""


class Speculative(ProgramContract, Protocol):
    """A Program with `speculative_tokens > 0` (issue 17)."""

    def prefill(self, tokens: Sequence[int], start: int, pages: Sequence[int], slot: int,
                mtp_pages: Sequence[int] = ()) -> np.ndarray: ...
    # A Program with `serves_prompt_logprobs` True also takes `all_logits=True`: logits `[n, V]`
    # of every token of the chunk (SamplingParams.prompt_logprobs).

    def spec_decode(self, rows: Sequence[DecodeRow], wanted: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Each row's Verify unit: (logits `[n, k+1, V]`, drafts `[n, k]`); nothing committed."""

    def spec_commit(self, keep: Sequence[int]) -> None:
        """Commit `keep[i]` accepted drafts of the Verify units `spec_decode` ran."""
