"""The order of rule versions: versions only move forward in the running job.

A version is a label (`3`, `1.10`, `2026-01-05`, `v2`), so it is ordered the way people
read software versions: split into runs of digits and of other characters, digit runs
compared as numbers, other runs as text, runs compared left to right (`2` < `10`,
`1.9` < `1.10`, `v2` < `v10`, `2026-01-05` < `2026-01-12`). A label that is a prefix of
another is the lower one (`1` < `1.1`, `2` < `2.0`).
"""

from __future__ import annotations

import re

_RUNS = re.compile(r"\d+|\D+")


def _runs(v: str) -> list[tuple[int, int | str]]:
    # (0, n) for digits sorts before (1, text) at the same position, so "1.0" vs "1a"
    # is decided and never compares an int with a str.
    return [(0, int(r)) if r.isdigit() else (1, r) for r in _RUNS.findall(v.strip())]


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as `a` is lower than, the same as, or higher than `b`."""
    ra, rb = _runs(a), _runs(b)
    return (ra > rb) - (ra < rb)
