"""Event-time helpers shared by the report and the data-quality checks.

They follow the timestamp rules of docs/rule-language.md exactly (ISO-8601 with offset or `Z`, UTC when
no offset; epoch numbers in milliseconds above 1e11, else seconds) so that a plot or a
quality check never disagrees with the engine about when an event happened.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

EPOCH_MS_CUTOFF = 1e11
_NUMERIC = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


def get_path(obj: object, path: str) -> object:
    """Value at a dotted path of nested JSON; None when any segment is missing."""
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def to_epoch_ms(value: object) -> int | None:
    """Epoch milliseconds of a timestamp value, or None when missing/unparseable."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        num = float(value)
    elif isinstance(value, str):
        if _NUMERIC.match(value):
            num = float(value)
        else:
            return _iso_to_ms(value.strip())
    else:
        return None
    if not math.isfinite(num):
        return None
    return int(math.floor(num)) if num > EPOCH_MS_CUTOFF else int(math.floor(num * 1000.0))


def _iso_to_ms(text: str) -> int | None:
    if not text:
        return None
    candidate = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        dt = datetime.fromisoformat(candidate)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(math.floor(dt.timestamp() * 1000))


def ms_to_iso(ms: int | float | None) -> str | None:
    """ISO-8601 UTC text (millisecond precision) for epoch milliseconds."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
