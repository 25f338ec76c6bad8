"""SCH-2: FIFO with bounded overtaking, checked on the queue itself."""
import pytest

from ninfer_jax.engine.scheduler import FreshQueue


class Item:
    def __init__(self, ticket, fits):
        self.ticket, self.fits = ticket, fits


@pytest.mark.parametrize("c", [1, 2, 4, 8])
def test_sch2_blocked_head_is_overtaken_at_most_c_times(c):
    q = FreshQueue(c, lambda i: i.ticket)
    head = Item(0, False)
    q.push(head)
    for t in range(1, 50):
        q.push(Item(t, True))
    passed = 0
    for _ in range(60):  # many cycles with free lanes: the head never fits
        q.dirty = True
        passed += len(q.scan(lanes_free=8, try_admit=lambda i: i.fits))
    assert passed == c, f"the blocked head was overtaken {passed} times, bound is C={c}"
    assert q.head() is head
    head.fits = True
    q.dirty = True
    assert q.scan(8, lambda i: i.fits)[0] is head  # once it fits, it goes first


def test_sch2_scan_window_and_fifo_order():
    q = FreshQueue(2, lambda i: i.ticket)
    items = [Item(t, True) for t in range(6)]
    for i in reversed(items):
        q.push(i)  # insertion by ticket, whatever the arrival order
    got = q.scan(lanes_free=10, try_admit=lambda i: i.fits)
    assert [i.ticket for i in got] == [0, 1, 2]  # head + at most C followers per scan


def test_sch3_no_rescan_without_an_event():
    q = FreshQueue(2, lambda i: i.ticket)
    q.push(Item(0, False))
    calls = []
    q.scan(2, lambda i: calls.append(i) or False)
    q.scan(2, lambda i: calls.append(i) or False)
    assert len(calls) == 1  # the same event does not re-quote a failed request
    q.push(Item(1, False))  # a queue change is an event
    q.scan(2, lambda i: calls.append(i) or False)
    assert len(calls) == 3
