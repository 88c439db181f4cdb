"""Stop on SIGTERM/SIGINT without taking a lock in the signal handler.

A Python signal handler runs in the main thread, between two bytecodes of whatever it was
doing. The services wait for their stop in that same thread (``stop.wait(tick)``), and
``threading.Event.set`` takes the lock that ``Event.wait`` holds for a few bytecodes on its way
in and out: a SIGTERM landing there makes the handler wait for a lock its own thread holds,
and the service never stops (systemd's SIGKILL ends it 90 s later; the same class of bug as
CPython gh-126434, for ``multiprocessing.Event``). So the handler here only writes a byte to
a pipe, which takes no lock, and a thread of its own reads it and sets the event.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType


def stop_event(*signums: signal.Signals) -> threading.Event:
    """An event set soon after any of ``signums`` (default SIGTERM and SIGINT) arrives; call
    from the main thread (only it may install handlers)."""
    stop = threading.Event()
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(write_end, False)

    def handler(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(BlockingIOError):  # full of earlier signals: stop is coming
            os.write(write_end, b"\0")

    def relay() -> None:
        os.read(read_end, 1)  # the first signal; later ones change nothing
        stop.set()

    try:
        for signum in signums or (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, handler)
    except ValueError:  # not the main thread: nothing is left open
        os.close(read_end)
        os.close(write_end)
        raise
    threading.Thread(target=relay, daemon=True, name="signals").start()
    return stop
