"""Capacity rules CFG-2..6 and RD-11."""
from __future__ import annotations

import pytest

import ledger as L
from ledger import capacity as cap


def test_cfg6_page_range():
    assert L.kv_page_range(4096, 1) == (64, 64)
    assert L.kv_page_range(4096, 8) == (64, 512)
    assert L.kv_page_range(100, 8) == (8, 16)  # ceil(100/64) = 2 < C = 8: each lane a page
    assert L.kv_page_range(1, 3) == (3, 3)


def test_cfg6_out_of_range_names_the_bound_and_numbers():
    with pytest.raises(L.CapacityConfigError, match=r"lower bound max\(ceil\(max_context/64\), C\) = max\(64, 2\) = 64"):
        L.check_kv_pages(63, 4096, 2)
    with pytest.raises(L.CapacityConfigError, match=r"upper bound C × ceil\(max_context/64\) = 2 × 64 = 128"):
        L.check_kv_pages(129, 4096, 2)
    assert L.check_kv_pages(100, 4096, 2) == 100


def test_rd11_kv_capacity_tokens_round_up_then_check():
    assert L.resolve_kv_pages(4097, 4096, 2) == 65
    assert L.pages_for_tokens(64) == 1 and L.pages_for_tokens(65) == 2 and L.pages_for_tokens(0) == 0
    with pytest.raises(L.CapacityConfigError, match="lower bound"):
        L.resolve_kv_pages(64 * 10, 4096, 2)


def test_cfg3_concurrency_bounds():
    with pytest.raises(L.CapacityConfigError, match="CFG-3"):
        L.kv_page_range(4096, 9)
    with pytest.raises(L.CapacityConfigError):
        L.kv_page_range(4096, 0)
    with pytest.raises(L.CapacityConfigError):
        L.kv_page_range(0, 1)
    with pytest.raises(L.CapacityConfigError):
        L.kv_page_range(4096.0, 1)


def test_cfg4_state_slots_default_c():
    assert L.state_slot_count(4) == 8
    assert L.state_slot_count(4, 0) == 4
    assert L.state_slot_count(2, 5) == 7
    with pytest.raises(L.CapacityConfigError):
        L.state_slot_count(2, -1)


def test_cfg5_default_host_capacity():
    assert L.default_host_capacity_bytes(1000) == 8 * (1 << 30) + 8000


def _budget(total, **kw):
    base = dict(budget_bytes=total, main_page_bytes=1000, state_slot_bytes=500, state_slots=4,
                workspace_bytes=300, compiled_step_bytes=200)
    base.update(kw)
    return L.DeviceBudget(**base)


def test_cfg2_solve_kv_pages_from_budget():
    # fixed = 4*500 + 300 + 200 = 2500; 64 pages lower bound (max_context 4096, C 2), 128 upper
    assert L.solve_kv_pages(_budget(2500 + 100 * 1000), 4096, 2) == 100
    assert L.solve_kv_pages(_budget(2500 + 100 * 1000 + 999), 4096, 2) == 100
    assert L.solve_kv_pages(_budget(10 ** 9), 4096, 2) == 128  # capped by CFG-6


def test_cfg2_solve_counts_backend_pages_exactly():
    # backend pool with 32-token pages of 300 B: 2 backend pages per Main page.
    b = _budget(2500 + 50 * 1600, backend_pools=((32, 300),))
    with pytest.raises(L.CapacityConfigError, match="backend KV 38400 B"):  # 64 pages needed, 50 fit
        L.solve_kv_pages(b, 4096, 1)
    b = _budget(2500 + 70 * 1600, backend_pools=((32, 300),))
    assert L.solve_kv_pages(b, 4096, 2) == 70
    assert cap.device_bytes(b, 70) <= b.budget_bytes < cap.device_bytes(b, 71)


def test_cfg6_budget_too_small_for_lower_bound_names_numbers():
    with pytest.raises(L.CapacityConfigError, match=r"cannot hold the CFG-6 lower bound of 64 Main KV pages.*short by 1 B"):
        L.solve_kv_pages(_budget(2500 + 64 * 1000 - 1), 4096, 2)


def test_cfg6_explicit_capacity_must_fit_device_memory():
    b = _budget(2500 + 80 * 1000)
    assert L.resolve_kv_pages(80 * 64, 4096, 2, b) == 80
    with pytest.raises(L.CapacityConfigError, match=r"exceeds the budget \d+ B by 1000 B"):
        L.resolve_kv_pages(81 * 64, 4096, 2, b)
    with pytest.raises(L.CapacityConfigError, match="no device memory budget"):
        L.resolve_kv_pages(None, 4096, 2)
