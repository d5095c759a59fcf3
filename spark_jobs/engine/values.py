"""How a rule reads an event: field paths, JSON-typed values, numbers and timestamps.

Everything here builds Spark Column expressions over the event parsed once into a
VARIANT column, so field access, coercion and timestamp parsing run in the JVM with no
per-row Python. The backtest and the streaming job both use these functions; that is
what makes "a rule means the same thing in both" true by construction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

# A numeric string: what "numeric strings coerce to numbers" means, precisely. Kept
# strict (no "1_000", "1d", "NaN", "inf") so every implementation agrees on it.
NUMERIC_RE = r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$"
EPOCH_MS_CUTOFF = 1e11  # epoch numbers above this are milliseconds, else seconds


def json_path(path: str) -> str:
    """`user.id` -> `$['user']['id']` (bracket form, so keys may hold any character)."""
    parts = []
    for seg in path.split("."):
        escaped = seg.replace("\\", "\\\\").replace("'", "\\'")
        parts.append(f"['{escaped}']")
    return "$" + "".join(parts)


def field(v: Column, path: str | Column) -> Column:
    """The value at `path` as VARIANT; NULL when missing. JSON null counts as missing.

    `path` is a dotted rule path, or a Column holding a JSON path (`json_path`) when
    the rule itself is data (the streaming job).
    """
    p = F.lit(json_path(path)) if isinstance(path, str) else path
    x = _variant_get(v, p)
    return F.when(~F.is_variant_null(x), x)


def _variant_get(v: Column, path: Column) -> Column:
    return F.call_function("try_variant_get", v, path, F.lit("variant"))


def json_text(x: Column) -> Column:
    """JSON text of a value (`1`, `"1"`, `true`): how keys compare (by JSON value)."""
    return F.to_json(x)


def _kind(text: Column) -> Column:
    return F.substring(text, 1, 1)


def as_string(x: Column) -> Column:
    """The string, when the value is a JSON string; else NULL."""
    return F.when(_kind(json_text(x)) == F.lit('"'), F.try_variant_get(x, "$", "string"))


def as_number(x: Column) -> Column:
    """A JSON number, or a numeric string, as DOUBLE; NULL for anything else (booleans too)."""
    text = json_text(x)
    kind = _kind(text)
    s = F.try_variant_get(x, "$", "string")
    return (
        F.when(kind.rlike("^[-0-9]$"), F.try_variant_get(x, "$", "double"))
        .when((kind == F.lit('"')) & s.rlike(NUMERIC_RE), F.trim(s).try_cast("double"))
    )


def epoch_to_ms(d: Column) -> Column:
    return F.when(d > F.lit(EPOCH_MS_CUTOFF), F.floor(d)).otherwise(F.floor(d * F.lit(1000.0))).cast("long")


def timestamp_ms(x: Column) -> Column:
    """Epoch milliseconds of a timestamp value; NULL when missing or unparseable.

    Numbers (and numeric strings) are epoch ms above 1e11, else epoch seconds; other
    strings are ISO-8601, UTC when they carry no offset (the session time zone is UTC).
    """
    n = as_number(x)
    s = as_string(x)
    iso = F.try_to_timestamp(s)
    return (
        F.when(n.isNotNull(), epoch_to_ms(n))
        .when(iso.isNotNull(), F.floor(F.unix_micros(iso) / F.lit(1000)).cast("long"))
    )


def field_timestamp_ms(v: Column, path: str) -> Column:
    return timestamp_ms(field(v, path))


def field_number(v: Column, path: str) -> Column:
    return as_number(field(v, path))


def field_key(v: Column, path: str | None) -> Column:
    """Grouping/correlation key: the JSON text of the value (so 1 and "1" differ).

    No path means one global key per rule; the empty string stands for it.
    """
    if path is None:
        return F.lit("")
    return json_text(field(v, path))


@dataclass(frozen=True)
class FieldValue:
    """The forms of one event value a comparison needs: JSON text (NULL when missing),
    number (numbers and numeric strings) and string (JSON strings only)."""

    json: Column
    num: Column
    str: Column

    @property
    def present(self) -> Column:
        return self.json.isNotNull()


def field_value(x: Column) -> FieldValue:
    """Inline forms of a VARIANT value (for data-driven paths, e.g. inside a lambda)."""
    return FieldValue(json_text(x), as_number(x), as_string(x))


def with_field_values(df: DataFrame, v: Column, paths: Iterable[str]) -> tuple[DataFrame, dict[str, FieldValue]]:
    """Extract each path once, as plain columns, before many conditions read it.

    Fifty rules testing `type` would otherwise extract and re-parse `type` fifty
    times, and the generated code for the whole projection would grow past the JIT's
    limits; here every path costs one extraction and conditions compare plain columns.
    """
    values: dict[str, FieldValue] = {}
    cols = []
    for i, path in enumerate(sorted(set(paths))):
        fv = field_value(field(v, path))
        names = (f"_f{i}_json", f"_f{i}_num", f"_f{i}_str")
        cols += [fv.json.alias(names[0]), fv.num.alias(names[1]), fv.str.alias(names[2])]
        values[path] = FieldValue(*(F.col(n) for n in names))
    return (df.select("*", *cols) if cols else df), values
