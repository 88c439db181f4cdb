"""core.signals: a stop signal that lands while the main thread is inside ``stop.wait`` still
stops the service (CONSTRUCTED: the landing is placed by hand).

A Python signal handler runs in the thread that was interrupted. ``Event.wait`` holds the
event's lock for a few bytecodes on its way in and out; a handler that calls ``Event.set``
there waits for that lock forever. The engine (and its standby) and ``analyze --every`` waited
for their stop so in the main thread, with ``stop.set`` as the handler (the agent's main thread
waits in a join instead, so it was not exposed; it uses the same helper now). Once, in a
clean-clone CI run (e1ef300, 2026-11-27), the engine was still running a minute after its
SIGTERM; this is a likely cause, not a proven one.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuwarden.core.signals import stop_event

SIG = signal.SIGUSR1  # not one pytest itself handles


@pytest.fixture
def restore_handler() -> Iterator[None]:
    before = signal.getsignal(SIG)
    yield
    signal.signal(SIG, before)


def lands_inside_wait(
    stop: threading.Event, handler: Callable[[int, Any], object], wait_s: float = 30.0
) -> bool:
    """Run ``handler`` as a signal would land in a thread inside ``stop.wait``: holding the
    event's lock. True if it returned (a thread of its own, so that a deadlock is seen and
    left behind instead of hanging the suite; a deadlock is for ever, so a second shows it)."""
    returned = threading.Event()

    def interrupted() -> None:
        with stop._cond:  # what Event.wait holds
            handler(SIG, None)
        returned.set()

    threading.Thread(target=interrupted, daemon=True).start()
    return returned.wait(wait_s)


def test_the_handler_the_services_had_deadlocks_there() -> None:
    """The control: ``lambda *_: stop.set()`` never returns from that spot."""
    stop = threading.Event()
    assert not lands_inside_wait(stop, lambda *_: stop.set(), wait_s=1.0)
    assert not stop.is_set()


def test_the_stop_event_handler_returns_there_and_the_stop_comes(restore_handler: None) -> None:
    stop = stop_event(SIG)
    handler = signal.getsignal(SIG)
    assert callable(handler)
    assert lands_inside_wait(stop, handler)
    assert stop.wait(30)


def test_a_real_signal_sets_it(restore_handler: None) -> None:
    stop = stop_event(SIG)
    assert not stop.is_set()
    signal.raise_signal(SIG)
    assert stop.wait(30)
    signal.raise_signal(SIG)  # a second one changes nothing, raises nothing
    assert stop.is_set()


def test_off_the_main_thread_it_is_refused_and_leaves_nothing_open() -> None:
    import os

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before, raised = fds(), []

    def elsewhere() -> None:
        try:
            stop_event(SIG)
        except ValueError as exc:
            raised.append(exc)

    worker = threading.Thread(target=elsewhere)
    worker.start()
    worker.join()
    assert raised and fds() == before


def test_the_services_wait_for_their_stop_so() -> None:
    """Every service that waits on a stop signal gets its event from ``stop_event``: no
    handler of the old kind is left."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for name in ("collector/cli.py", "analytics/cli.py", "remediation/cli.py"):
        text = (root / name).read_text(encoding="utf-8")
        assert "stop_event(" in text, name
        assert ".set())" not in text and "stop.set()" not in text, name
