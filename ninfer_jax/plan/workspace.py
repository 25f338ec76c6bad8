"""The steps the Program compiles and what they take on the device: workspace and compiled code.

**Step shapes.** A prefill chunk is 1 row × `chunk_size` tokens; a decode step runs one bucket
of rows, the buckets powers of two from 2 up to the first one ≥ C (`decode_buckets`). The
Program compiles one prefill program per chunk length (`prefill_chunk_lengths`: `chunk_size` and
its quarters down to 64 tokens) and page-table width (`prefill_table_widths`: with the XLA
attention, tables of a quarter each down to one chunk's pages; one with Pallas) and one decode
program per bucket (with speculative decoding two per bucket: the draft-and-verify step and the
commit).

**Workspace**: the activations of the largest step, `max(prefill, decode, store moves)`. For r
rows of t tokens (n = r·t):

      n × A × 4                        per-token activations of one layer, as float32:
                                       A = 4·H (residual stream, norm, mixer and FF outputs)
                                         + max(GDN: conv_dim + 3·Hv·Dv + 2·Hv + 2·Hv·Dk,
                                               attention: 3·Hq·D + 2·Hkv·D)
                                         + max(dense: 2·I, MoE: E + k·(2·H + 2·I_moe) + 2·I_shared)
    + r × V × (itemsize + 4)           the logits and their float32 copy
    + r × 2 × (Hv·Dk·Dv·4 + (K-1)·conv_dim·itemsize)   one GDN layer's state read and written
    + r × 2·S·Hkv·D·4 + 3 × Hq·t·S·4 (backend xla/interpret; S = pages per request × 64):
    + [r > 1] 2·S·Hkv·D·4              the rows' whole page tables gathered as float32 K and V,
                                       and one row's scores, masked scores and probabilities
                                       (the reference attends row by row, for batch invariance;
                                       with several rows, the row's K and V sliced for the loop);
                                       the Pallas kernels read pages in place and add nothing here

  store moves: one request's whole context packed on the device for the Host (a Snapshot
  pause at `max_context`, PAUSE-2, or its read-back): pages per request × page bytes + one
  StateImage. Moves of several requests in flight together can exceed it.

  The MoE term assumes a grouped (ragged) matmul, work proportional to top-k; XLA:CPU lowers
  `ragged_dot` densely and needs far more, one more reason the CPU default charges nothing.

**Compiled steps**: an allowance, not a measurement: each model-step program 16 MiB + 1 MiB per
layer, plus 64 MiB for the head, the stores' movers and the backend's own.
"""
from __future__ import annotations

import dataclasses

from ledger import capacity as cap
from ninfer_jax.config import EngineConfig
from ninfer_jax.model.config import ModelConfig

# Two rows at least, even at C = 1 (a padding row writes nothing): XLA drops a size-1 row
# axis and compiles a one-row step to other fusions, where a multiply-add may be contracted
# into an FMA differently, so one row alone would round otherwise than the same row in any
# larger bucket (batch invariance, doctrine 1; tests/engine/test_engine_batch_invariant.py).
DECODE_BUCKETS = (2, 4, 8)

MIB = 1 << 20
COMPILED_STEP_BASE_BYTES = 16 * MIB  # per model-step program (prefill bucket, decode bucket)
COMPILED_STEP_LAYER_BYTES = 1 * MIB  # and per model layer in it
COMPILED_OTHER_BYTES = 64 * MIB  # the head program, the stores' movers, the backend's own


def decode_buckets(max_concurrency: int) -> tuple[int, ...]:
    """Row buckets covering 1..C: powers of two from 2 up to the first one >= C."""
    out = []
    for b in DECODE_BUCKETS:
        out.append(b)
        if b >= max_concurrency:
            break
    return tuple(out)


PREFILL_WIDTH_STEP = 4  # each narrower prefill page table holds a quarter of the one above


def prefill_table_widths(pages_per_request: int, chunk_size: int, backend: str) -> tuple[int, ...]:
    """Page-table widths (pages) a prefill chunk is compiled for, ascending; the chunk runs the
    narrowest that holds the pages up to its end.

    The XLA attention reads every page of its table, so one table `max_context` wide made a chunk
    near the start of a long context cost as much as one at its end. Widths of a quarter each,
    down to the pages of one chunk (and the MTP layers' one-slot offset), keep a chunk within 4x
    of the keys it reads at the price of a few more prefill programs. A chunk's width depends on
    its own end only, never on another request. The Pallas kernels read only the pages a row
    holds: one width (the whole table)."""
    if backend not in ("xla", "interpret"):
        return (pages_per_request,)
    least = min(pages_per_request, cap.pages_for_tokens(chunk_size + 1))
    widths = [pages_per_request]
    while widths[-1] > least:
        widths.append(max(least, cap.ceil_div(widths[-1], PREFILL_WIDTH_STEP)))
    return tuple(reversed(widths))


PREFILL_LENGTH_STEP = 4  # each shorter prefill chunk program holds a quarter of the tokens of the one above
PREFILL_LEAST_LENGTH = 64  # no chunk program shorter than this (one Main KV page of tokens)


def prefill_chunk_lengths(chunk_size: int) -> tuple[int, ...]:
    """Token lengths (ascending) a prefill chunk is compiled for: `chunk_size`, and quarters of it
    down to `PREFILL_LEAST_LENGTH`. A chunk runs the shortest that holds its tokens, so the short
    tail of a prompt — an agent's next turn after a cache hit is often one — is not padded to
    `chunk_size` (a 44-token chunk of Qwen3.5-0.8B's widths: 0.27 s at 64 tokens against 0.93 s at
    256, CPU). The length depends on the chunk's own tokens only, never on another request."""
    lengths = [chunk_size]
    while lengths[-1] % PREFILL_LENGTH_STEP == 0 and lengths[-1] // PREFILL_LENGTH_STEP >= PREFILL_LEAST_LENGTH:
        lengths.append(lengths[-1] // PREFILL_LENGTH_STEP)
    return tuple(reversed(lengths))


def step_programs(buckets: tuple[int, ...], speculative: bool, prefill_widths: int = 1,
                  prefill_lengths: int = 1) -> int:
    """Model-step programs compiled at warm-up: a prefill program per chunk length
    (`prefill_chunk_lengths`) and page-table width (`prefill_table_widths`), and every decode
    bucket (two per bucket with speculative decoding)."""
    return prefill_widths * prefill_lengths + (2 if speculative else 1) * len(buckets)


def compiled_step_programs(config: EngineConfig) -> int:
    """`step_programs` of a config's decode buckets, prefill widths and lengths and speculative decoding."""
    widths = prefill_table_widths(cap.pages_for_tokens(config.max_context), config.chunk_size, config.backend)
    return step_programs(decode_buckets(config.max_concurrency), bool(config.speculative_tokens), len(widths),
                         len(prefill_chunk_lengths(config.chunk_size)))


def compiled_program_bytes(model: ModelConfig) -> int:
    """The allowance for one model-step program: 16 MiB + 1 MiB per layer (module doc)."""
    return COMPILED_STEP_BASE_BYTES + model.num_layers * COMPILED_STEP_LAYER_BYTES


def compiled_step_bytes(config: EngineConfig, model: ModelConfig) -> int:
    """The documented allowance for compiled code on the device (module doc)."""
    return compiled_step_programs(config) * compiled_program_bytes(model) + COMPILED_OTHER_BYTES


def token_width(model: ModelConfig) -> int:
    """A: float32 elements per token live in one layer's step (see the module doc)."""
    h = model.hidden_size
    hv, dk, dv = model.linear_num_value_heads, model.linear_key_head_dim, model.linear_value_head_dim
    hq, hkv, d = model.num_attention_heads, model.num_key_value_heads, model.head_dim
    mixer = 0
    if model.linear_layers:
        mixer = max(mixer, model.conv_dim + 3 * hv * dv + 2 * hv + 2 * hv * dk)
    if model.attention_layers:
        mixer = max(mixer, 3 * hq * d + 2 * hkv * d)
    ff = 0
    if "dense" in model.mlp_types:
        ff = max(ff, 2 * model.intermediate_size)
    if "moe" in model.mlp_types:
        ff = max(ff, model.num_experts + model.num_experts_per_tok * (2 * h + 2 * model.moe_intermediate_size)
                 + 2 * model.shared_expert_intermediate_size)
    return 4 * h + mixer + ff


def step_workspace_bytes(model: ModelConfig, rows: int, tokens: int, pages_per_request: int, itemsize: int,
                         backend: str) -> int:
    """Device workspace of one step over `rows` rows of `tokens` tokens (the module doc's formula)."""
    n = rows * tokens
    out = n * token_width(model) * 4
    out += rows * model.vocab_size * (itemsize + 4)
    if model.linear_layers:
        hv = model.linear_num_value_heads
        per_row = hv * model.linear_key_head_dim * model.linear_value_head_dim * 4 + (
            model.linear_conv_kernel_dim - 1) * model.conv_dim * itemsize
        out += rows * 2 * per_row
    if model.attention_layers and backend in ("xla", "interpret"):
        s = pages_per_request * cap.PAGE_TOKENS
        out += rows * 2 * s * model.num_key_value_heads * model.head_dim * 4
        # the reference attends row by row (batch invariance): one row's scores at a time, and
        # with several rows, the row's keys and values sliced out for the loop's body
        out += 3 * model.num_attention_heads * tokens * s * 4
        if rows > 1:
            out += 2 * s * model.num_key_value_heads * model.head_dim * 4
    return out


@dataclasses.dataclass(frozen=True)
class Workspace:
    prefill_bytes: int  # one prefill chunk: 1 row × chunk_size tokens
    decode_bytes: int  # the largest decode bucket: decode_rows × 1 token
    decode_rows: int
    store_bytes: int  # one request's whole context packed for the Host: its pages and its StateImage
    store_pages: int

    @property
    def bytes(self) -> int:
        return max(self.prefill_bytes, self.decode_bytes, self.store_bytes)


def workspace(model: ModelConfig, itemsize: int, *, chunk_size: int, decode_rows: int, pages_per_request: int,
              page_bytes: int, state_image_bytes: int, backend: str) -> Workspace:
    """The workspace of the steps: a prefill chunk, the largest decode bucket (`decode_rows`), and
    one request's context (`pages_per_request` pages of `page_bytes` and a StateImage) to the Host."""
    return Workspace(
        prefill_bytes=step_workspace_bytes(model, 1, chunk_size, pages_per_request, itemsize, backend),
        decode_bytes=step_workspace_bytes(model, decode_rows, 1, pages_per_request, itemsize, backend),
        decode_rows=decode_rows, store_bytes=pages_per_request * page_bytes + state_image_bytes,
        store_pages=pages_per_request)
