"""SIGINT/SIGTERM handling shared by the long-running commands.

They all stop the same way: the signal only sets an Event, and the command's own loop
winds down (stop children, flush producers) and exits 0 instead of dying mid-write.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

Handler = Callable[[int, FrameType | None], None]


def install_handlers(stop: threading.Event, handler: Handler | None = None) -> dict[int, object]:
    """Route SIGINT and SIGTERM to `handler` (default: set `stop`); returns the previous
    handlers. Outside the main thread (where Python cannot set handlers) does nothing."""

    def default(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler or default)
    return previous


def restore_handlers(previous: dict[int, object]) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)  # type: ignore[arg-type]
