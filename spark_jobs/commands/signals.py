"""SIGINT/SIGTERM handling shared by the long-running commands.

They all stop the same way: the signal only sets an Event, and the command's own loop
winds down (stop children, flush producers) and exits 0 instead of dying mid-write.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Protocol

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


class Service(Protocol):
    def start(self) -> object: ...

    def stop(self) -> None: ...


def serve(command: str, service: Service, errors: tuple[type[BaseException], ...],
          announce: Callable[[], list[str]], failure: Callable[[], str | None], what: str) -> int:
    """The foreground life of `rulectl broker` and `rulectl cluster`: start `service` (a
    start error in `errors` is printed, exit 1), print `announce()`, then wait for
    Ctrl-C/SIGTERM (exit 0) unless `failure()` names a reason to give up (exit 1); the
    service is stopped either way once it started."""
    stop = threading.Event()
    previous = install_handlers(stop)
    try:
        try:
            service.start()
        except errors as exc:
            print(f"{command}: {exc}", file=sys.stderr)
            return 1
        try:
            for line in announce():
                print(line, flush=True)
            print("press Ctrl-C to stop", flush=True)
            while not stop.wait(0.5):
                reason = failure()
                if reason:
                    print(f"{command}: {reason}", file=sys.stderr)
                    return 1
            print(f"stopping {what}", flush=True)
            return 0
        finally:
            service.stop()
    finally:
        restore_handlers(previous)
