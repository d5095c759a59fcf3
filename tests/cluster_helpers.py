"""Helpers of the scale-out tests (three Kafka brokers, a Spark standalone cluster)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def free_block(n: int, start: int = 41000) -> int:
    """A first port p with p..p+n-1 all free now (cluster ports are consecutive)."""
    for base in range(start, 60000, 97):
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block")


def wait_until(pred: Callable[[], T], timeout: float, what: str, every: float = 0.5) -> T:
    """pred()'s first truthy answer; an exception counts as "not yet" (a node bouncing)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            got = pred()
        except Exception as exc:
            got, last = None, exc
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last})")
