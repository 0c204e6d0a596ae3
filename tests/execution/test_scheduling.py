"""Completion-driven scheduling of the Ray executor, on a simulated cluster clock."""

import heapq
import itertools

import pytest

from structlens.execution.ray import _in_item_order, start_order


class _Clock:
    """A stand-in for ``ray``: a call on a free slot finishes ``cost`` time units later."""

    def __init__(self, cost):
        self.cost, self.now, self.started = cost, 0.0, []
        self._finish, self._value, self._tick = {}, {}, itertools.count()
        self.cancelled = []

    def submit(self, slot, item):
        ref = next(self._tick)
        self.started.append(item)
        self._finish[ref] = (self.now + self.cost[item], ref)
        self._value[ref] = item * 10
        return ref

    def wait(self, refs, num_returns):
        t, ref = min(self._finish[r] for r in refs)
        self.now = t
        return [ref], [r for r in refs if r != ref]

    def get(self, ref):
        return self._value[ref]

    def cancel(self, ref):
        self.cancelled.append(ref)


class _Bar:
    def update(self):
        pass


def _lpt_makespan(cost, slots):
    free = [0.0] * slots
    for c in sorted(cost, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_costliest_first_in_item_order_at_the_lpt_makespan(slots):
    cost = [512, 1024, 2048, 4096, 256]
    clock = _Clock(cost)
    order = start_order(len(cost), cost)
    out = list(_in_item_order(clock, clock.submit, slots, list(range(5)), order, _Bar()))
    assert out == [i * 10 for i in range(5)]  # item order, whatever finished first
    assert clock.started == [3, 2, 1, 0, 4]  # costliest first
    assert clock.now == _lpt_makespan(cost, slots)  # a slot takes the next item when it frees


def test_listed_order_starts_the_widest_late():
    # widths as listed on 2 slots: 4096 starts only when 1024 ends -> 5120 units, not 4096
    cost = [512, 1024, 2048, 4096, 256]
    listed = _Clock(cost)
    list(_in_item_order(listed, listed.submit, 2, list(range(5)), start_order(5, None), _Bar()))
    assert listed.now == 1024 + 4096 > _lpt_makespan(cost, 2) == 4096


def test_a_caller_that_stops_reading_cancels_what_is_in_flight():
    clock = _Clock([1, 5, 5])
    gen = _in_item_order(clock, clock.submit, 2, [0, 1, 2], [0, 1, 2], _Bar())
    assert next(gen) == 0
    gen.close()
    assert len(clock.cancelled) == 2


def test_start_order_validates_the_cost():
    assert start_order(3, [1.0, 3.0, 3.0]) == [1, 2, 0]  # ties keep their listed order
    with pytest.raises(ValueError, match="one finite estimate per item"):
        start_order(3, [1.0, 2.0])
    with pytest.raises(ValueError, match="one finite estimate per item"):
        start_order(2, [1.0, float("nan")])
