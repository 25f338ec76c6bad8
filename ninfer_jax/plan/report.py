"""A `CapacityPlan` (`plan` below) as `ninfer plan` prints it: one JSON object, or aligned lines
`label  size  how`, the `how` of each figure being the reason the plan gives it (`CapacityPlan.reasons`)."""
from __future__ import annotations

from typing import Any

from ninfer_jax.plan.split import DEFAULT_SPLIT_RULE
from ninfer_jax.plan.units import size
from ninfer_jax.plan.workspace import COMPILED_OTHER_BYTES


def as_dict(plan) -> dict[str, Any]:
    """One JSON object (`ninfer plan --json`)."""
    ws = plan.workspace
    return {
        "model": plan.model, "model_type": plan.model_type, "dtype": plan.dtype, "itemsize": plan.itemsize,
        "max_concurrency": plan.max_concurrency, "max_context": plan.max_context,
        "max_context_lowered_from": plan.max_context_lowered_from,
        "chunk_size": plan.chunk_size, "backend": plan.backend,
        "budget": {"source": plan.source, "device": plan.device, "device_bytes": plan.device_bytes,
                   "device_in_use_bytes": plan.device_in_use_bytes,
                   "in_use_charged_bytes": plan.in_use_charged_bytes,
                   "device_memory_fraction": plan.device_memory_fraction, "usable_bytes": plan.usable_bytes,
                   "budget_bytes": plan.budget_bytes, "charged": plan.charged,
                   "charged_bytes": plan.charged_bytes, "free_bytes": plan.free_bytes},
        "weights": {"parameters": plan.parameters, "bytes": plan.weights_bytes, "charged": plan.charged},
        "main_kv": {"pages": plan.kv_pages, "tokens": plan.kv_tokens, "page_bytes": plan.kv_page_bytes,
                    "bytes": plan.kv_bytes, "min_pages": plan.kv_page_range[0],
                    "max_pages": plan.kv_page_range[1], "limited_by": plan.kv_limited_by,
                    "pages_per_request": plan.pages_per_request},
        "state_slots": {"count": plan.state_slots, "bytes_each": plan.state_slot_bytes,
                        "bytes": plan.state_bytes},
        "backend_pools": {"pools": [list(p) for p in plan.backend_pools], "bytes": plan.backend_pool_bytes},
        "workspace": {"bytes": ws.bytes, "prefill_bytes": ws.prefill_bytes, "decode_bytes": ws.decode_bytes,
                      "decode_rows": ws.decode_rows, "store_bytes": ws.store_bytes,
                      "store_pages": ws.store_pages, "charged": plan.charged},
        "compiled_steps": {"bytes": plan.compiled_step_bytes, "programs": plan.compiled_step_programs,
                           "bytes_per_program": plan.compiled_program_bytes, "charged": plan.charged},
        "host_arena_bytes": plan.host_arena_bytes,
        "split": _split_dict(plan),
        **({"cache": plan.cache.as_dict()} if plan.cache is not None else {}),
    }


def _split_dict(plan) -> dict[str, Any]:
    at = plan.default_split_pools
    return {"default": plan.default_split, "rule": DEFAULT_SPLIT_RULE,
            "pool_bytes": at.cache_device_bytes if at is not None else plan.pool_bytes,
            "state_slots": at.state_slots if at is not None else None,
            "kv_pages": at.kv_pages if at is not None else None}


def _split_row(plan) -> str:
    at = plan.default_split_pools
    where = (f"; {size(at.cache_device_bytes)} of pools at S would be {at.state_slots:,} StateImage slots + "
             f"{at.kv_pages:,} Main KV pages" if at is not None else "")
    return f"S = {plan.default_split:.4g}, {DEFAULT_SPLIT_RULE}{where}"


def _lowered(plan) -> str:
    """CFG-6: the Main KV row's note when kv_capacity lowered max_context."""
    was = plan.max_context_lowered_from
    return "" if was is None else (f"; below one max_context of {was:,}: max_context lowered to {plan.max_context:,}, "
                                   f"a longer request is refused")


def rows(plan) -> list[tuple[str, int | None, str]]:
    """(label, bytes or None, the reason for the figure), in `ninfer plan`'s order."""
    ws = plan.workspace
    lo, hi = plan.kv_page_range
    nc = "" if plan.charged else "; not charged (no device statistics)"
    out = []
    if plan.source == "default":
        out.append(("device memory", None, f"{plan.device}: no memory statistics; the pools get the "
                                           f"default {size(plan.budget_bytes)} budget (CFG-2)"))
    elif plan.source == "cache_device_bytes":
        nc = "; not charged (the pools share --cache_device_bytes)"
        out.append(("cache bytes", plan.budget_bytes, plan.cache.text()))
    else:
        where = "--device_memory_bytes" if plan.source == "device_memory_bytes" else f"{plan.device} bytes_limit"
        out.append(("device memory", plan.device_bytes, f"{plan.device_bytes:,} B ({where})"))
        if plan.source == "memory_stats":
            out.append(("in use by others", plan.in_use_charged_bytes,
                        f"bytes_in_use {plan.device_in_use_bytes:,} B less this engine's own weights"))
        minus = " - in use by others" if plan.source == "memory_stats" else ""
        out.append(("usable", plan.usable_bytes, f"{plan.usable_bytes:,} B = device memory × "
                                                 f"device_memory_fraction {plan.device_memory_fraction:g}{minus}"))
    out += [
        ("weights", plan.weights_bytes, f"{plan.parameters:,} parameters × {plan.itemsize} B{nc}"),
        ("Main KV", plan.kv_bytes, f"{plan.kv_pages:,} pages × {size(plan.kv_page_bytes)} = {plan.kv_tokens:,} "
                                   f"tokens; {plan.kv_limited_by} (CFG-6 range {lo:,}..{hi:,} pages){_lowered(plan)}"),
        ("StateImage slots", plan.state_bytes, f"{plan.state_slots} × {size(plan.state_slot_bytes)} "
                                               f"({plan.state_slot_bytes:,} B): {plan.max_concurrency} basic + "
                                               f"{plan.state_slots - plan.max_concurrency} device_state_slots"),
        ("backend pools", plan.backend_pool_bytes, ", ".join(
            f"{pt}-token pages of {pb:,} B" for pt, pb in plan.backend_pools) or "none built"),
        ("workspace", ws.bytes, f"the largest of prefill 1 × {plan.chunk_size} tokens {size(ws.prefill_bytes)}, "
                                f"decode {ws.decode_rows} rows {size(ws.decode_bytes)}, one request's context "
                                f"to the Host ({ws.store_pages:,} pages + 1 StateImage) {size(ws.store_bytes)}{nc}"),
        ("compiled steps", plan.compiled_step_bytes,
         f"{plan.compiled_step_programs} step programs × {size(plan.compiled_program_bytes)} + "
         f"{size(COMPILED_OTHER_BYTES)} (an allowance){nc}"),
        ("free", plan.free_bytes, f"{plan.free_bytes:,} B of the {plan.budget_bytes:,} B budget unused"),
        ("Host arena", plan.host_arena_bytes, "host memory (CFG-5), not on the device"),
        ("default split", None, _split_row(plan)),
    ]
    if plan.cache is not None and plan.source != "cache_device_bytes":
        out.append(("cache bytes", plan.cache.cache_device_bytes, plan.cache.text()))
    return out


def text(plan) -> str:
    """The plan as aligned lines, `label  size  how` (`ninfer plan`)."""
    lines = rows(plan)
    head = (f"ninfer plan: {plan.model} ({plan.model_type}), {plan.dtype}, C={plan.max_concurrency}, "
            f"max_context={plan.max_context}, chunk_size={plan.chunk_size}, backend={plan.backend}")
    width = max(len(k) for k, _, _ in lines)
    sizes = [size(n) if n is not None else "" for _, n, _ in lines]
    col = max(len(x) for x in sizes)
    return "\n".join([head] + [f"{k:<{width}}  {x:>{col}}  {how}" for (k, _, how), x in zip(lines, sizes)])
