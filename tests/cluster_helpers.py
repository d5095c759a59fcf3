"""Helpers of the scale-out tests (three Kafka brokers, a Spark standalone cluster)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def _worker_offset() -> int:
    """Each pytest-xdist worker searches its own port range: two workers starting a
    cluster at once would otherwise both find the same first free block."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return 5000 * int(worker[2:]) if worker[2:].isdigit() else 0


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports a cluster takes above its first one (controller +500, Spark master +1000, its
# web UIs +1100..), kept below the ephemeral range too.
_CLUSTER_SPAN = 1500


def free_block(n: int, start: int | None = None) -> int:
    """A first port p with p..p+n-1 all free now (cluster ports are consecutive); from
    this worker's own range unless `start` is given.

    Below the kernel's ephemeral range: a port there that is free when looked at can be
    taken a moment later as the local port of any outgoing connection (the Kafka and
    Spark clients of the other test worker make many), and the broker then fails to
    bind it ("Address already in use", seen in CI).
    """
    low = _ephemeral_low()
    start = 20000 + _worker_offset() if start is None else start
    end = low - _CLUSTER_SPAN - n if start + n + _CLUSTER_SPAN < low else 65000 - n
    for base in range(start, end, 97):
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
