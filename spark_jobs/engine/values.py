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

from spark_jobs.rules.model import AnyRule

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


def as_string(x: Column, text: Column | None = None) -> Column:
    """The string, when the value is a JSON string; else NULL. `text`: the value's
    JSON text when the caller already has it."""
    text = json_text(x) if text is None else text
    return F.when(_kind(text) == F.lit('"'), F.try_variant_get(x, "$", "string"))


def as_number(x: Column, text: Column | None = None, string: Column | None = None) -> Column:
    """A JSON number, or a numeric string, as DOUBLE; NULL for anything else (booleans
    too). `text`, `string`: the value's JSON text and `as_string` when already known."""
    kind = _kind(json_text(x) if text is None else text)
    s = F.try_variant_get(x, "$", "string") if string is None else string
    return (
        F.when(((kind >= F.lit("0")) & (kind <= F.lit("9"))) | (kind == F.lit("-")), F.try_variant_get(x, "$", "double"))
        .when((kind == F.lit('"')) & s.rlike(NUMERIC_RE), F.trim(s).try_cast("double"))
    )


def epoch_to_ms(d: Column) -> Column:
    return F.when(d > F.lit(EPOCH_MS_CUTOFF), F.floor(d)).otherwise(F.floor(d * F.lit(1000.0))).cast("long")


def timestamp_ms(x: Column) -> Column:
    """Epoch milliseconds of a timestamp value; NULL when missing or unparseable.

    Numbers (and numeric strings) are epoch ms above 1e11, else epoch seconds; other
    strings are ISO-8601, UTC when they carry no offset (the session time zone is UTC).
    """
    return timestamp_of(as_number(x), as_string(x))


def timestamp_of(num: Column, text: Column) -> Column:
    """`timestamp_ms` from a value's number and string forms (see FieldValue)."""
    # The ISO parse sits in the ELSE branch alone, so an epoch number never pays for it
    # (a CASE's shared subexpressions are computed for every row).
    iso = F.try_to_timestamp(text)
    return F.when(num.isNotNull(), epoch_to_ms(num)).otherwise(F.floor(F.unix_micros(iso) / F.lit(1000)).cast("long"))


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


@dataclass(frozen=True)
class Fields:
    """The event fields a rule set reads, extracted once into plain columns.

    The event is parsed once into VARIANT; every path any rule names is then read out
    once (JSON text, number, string and, for time fields, epoch ms) before the rules
    run. Fifty rules testing `type` would otherwise extract and convert it fifty times,
    each later pass over the cached events would decode the VARIANT again, and the
    generated code for a big projection would outgrow the JIT's limits.
    """

    values: dict[str, FieldValue]
    times: dict[str, Column]

    def value(self, path: str) -> FieldValue:
        return self.values[path]

    def key(self, path: str | None) -> Column:
        """Grouping/correlation key: the JSON text of the value (so 1 and "1" differ).
        No path means one global key per rule; the empty string stands for it."""
        return F.lit("") if path is None else self.values[path].json

    def time(self, path: str) -> Column:
        return self.times[path]


def rule_paths(rules: Iterable[AnyRule]) -> tuple[set[str], set[str]]:
    """(value paths, timestamp paths) that `rules` read."""
    values: set[str] = set()
    times: set[str] = set()
    for r in rules:
        values |= {c.field for c in getattr(r, "conditions", None) or []}
        for name in ("aggregation_field", "group_by", "correlation_key", "context_value_field",
                     "context_type_field", "event_value_field"):
            if getattr(r, name, None):
                values.add(getattr(r, name))
        if getattr(r, "timestamp_field", None):
            times.add(r.timestamp_field)
    return values, times


def extract_fields(
    df: DataFrame, rules: Iterable[AnyRule], time_paths: Iterable[str] = (), v: Column | None = None
) -> tuple[DataFrame, Fields]:
    """`df` plus one column per form of each field `rules` read (see Fields)."""
    v = F.col("v") if v is None else v
    value_paths, times = rule_paths(rules)
    times |= set(time_paths)
    paths = sorted(value_paths | times)
    # One projection per step, each reading the previous step's columns: written as one
    # expression, every form would look the path up and serialize it again (Spark does
    # not share subexpressions inside CASE branches), several times per field and row.
    names = {p: (f"__f{i}_x", f"__f{i}_json", f"__f{i}_num", f"__f{i}_str") for i, p in enumerate(paths)}
    x = {p: F.col(n[0]) for p, n in names.items()}
    steps: list[list[Column]] = [
        # The raw lookup (JSON null still a VARIANT null): `field` would look it up twice.
        [_variant_get(v, F.lit(json_path(p))).alias(names[p][0]) for p in paths],
        [F.when(~F.is_variant_null(x[p]), json_text(x[p])).alias(names[p][1]) for p in paths],
        [as_string(x[p], F.col(names[p][1])).alias(names[p][3]) for p in paths],
        [as_number(x[p], F.col(names[p][1]), F.col(names[p][3])).alias(names[p][2]) for p in paths],
    ]
    out = df
    for step in steps:
        out = out.select("*", *step)
    values = {p: FieldValue(F.col(names[p][1]), F.col(names[p][2]), F.col(names[p][3])) for p in paths}
    time_cols = {p: F.col(f"__t{i}") for i, p in enumerate(sorted(times))}
    if times:
        out = out.select("*", *[timestamp_of(values[p].num, values[p].str).alias(f"__t{i}") for i, p in enumerate(sorted(times))])
    out = out.drop(*[n[0] for n in names.values()])
    return out, Fields(values, time_cols)
