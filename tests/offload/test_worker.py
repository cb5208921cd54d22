"""The CPU optimizer worker's order: ready tasks by priority, else the earliest queued."""

from __future__ import annotations

import threading

from carina.offload.worker import PriorityWorker


def _run_held(tasks: list[tuple[str, int, bool | None]]) -> list[str]:
    """Queue ``(name, priority, ready)`` tasks behind a gate; the order the worker ran them in."""
    worker = PriorityWorker()
    gate, order = threading.Event(), []
    worker.submit(gate.wait, priority=-100)
    futs = [
        worker.submit(order.append, name, priority=prio, ready=None if ready is None else (lambda r=ready: r))
        for name, prio, ready in tasks
    ]
    gate.set()
    for fut in futs:
        fut.result(timeout=10)
    worker.shutdown()
    return order


def test_ready_tasks_run_by_priority_before_waiting_ones() -> None:
    # 0 and 1 have the lowest priorities but their inputs are not there: the ready 15 and 14 go first
    order = _run_held([("b15", 15, True), ("b14", 14, True), ("b1", 1, False), ("b0", 0, False)])
    assert order[:2] == ["b14", "b15"]
    assert order[2:] == ["b1", "b0"]  # none ready: the earliest queued (its copy lands first)


def test_without_readiness_the_order_is_priority_then_fifo() -> None:
    order = _run_held([("x", 3, None), ("y", 1, None), ("z", 1, None), ("w", -2, None)])
    assert order == ["w", "y", "z", "x"]


def test_a_ready_predicate_that_turns_true_is_seen() -> None:
    flag = {"ready": False}
    worker = PriorityWorker()
    gate, order = threading.Event(), []
    worker.submit(gate.wait, priority=-100)
    late = worker.submit(order.append, "late", priority=0, ready=lambda: flag["ready"])
    early = worker.submit(order.append, "other", priority=5, ready=lambda: True)
    flag["ready"] = True  # ready by the time the worker looks
    gate.set()
    late.result(timeout=10), early.result(timeout=10)
    worker.shutdown()
    assert order == ["late", "other"]
