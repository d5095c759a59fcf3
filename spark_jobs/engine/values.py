"""How a rule reads an event: field paths, JSON-typed values, numbers and timestamps.

Everything here builds Spark Column expressions over the event parsed once into a
VARIANT column, so field access, coercion and timestamp parsing run in the JVM with no
per-row Python. The backtest and the streaming job both use these functions; that is
what makes "a rule means the same thing in both" true by construction.

One part has a second implementation: in a classic session with the platform's jars,
the backtest reads the fields (presence, JSON text, kind, string) through one JVM call
per event (`EventFields`, see `jvm_reads`), which cost 1.1 s where these expressions
cost 2.6 s in a warm 1M-event scan. Everything after those reads (numbers, numeric
strings, timestamps, comparisons) is the same expressions either way, and
tests/integration/test_event_fields_jvm.py holds the two reads equal.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.rules.model import AnyRule
from spark_jobs.spark import jvm_class

# A numeric string: what "numeric strings coerce to numbers" means, precisely. Kept
# strict (no "1_000", "1d", "NaN", "inf") so every implementation agrees on it.
NUMERIC_RE = r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$"
EPOCH_MS_CUTOFF = 1e11  # epoch numbers above this are milliseconds, else seconds
_MAX_DOUBLE = 1.7976931348623157e308


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


def _text_kinds(text: Column) -> tuple[Column, Column]:
    """(is a string, is a number) from a value's JSON text."""
    first = F.substring(text, 1, 1)
    return first == F.lit('"'), first.between(F.lit("0"), F.lit("9")) | (first == F.lit("-"))


def _type_kinds(type_name: Column) -> tuple[Column, Column]:
    """(is a string, is a number) from a value's `schema_of_variant`: a cheaper test
    than rendering the value as JSON, for fields whose JSON text nothing reads."""
    number = type_name.isin("BIGINT", "INT", "SMALLINT", "TINYINT", "DOUBLE", "FLOAT") | type_name.startswith("DECIMAL")
    return type_name == F.lit("STRING"), number


def _string_if(x: Column, is_string: Column) -> Column:
    return F.when(is_string, F.try_variant_get(x, "$", "string"))


def _number_if(is_string: Column, is_number: Column, string: Column, as_double: Column) -> Column:
    """A JSON number (`as_double`: its reading, see _number_reading), or a numeric string
    (`string`: the value as `as_string`), as DOUBLE.

    Only finite numbers: a literal beyond the double range (`1e400`, or the string
    "1e400") would read as Infinity and pass every `>` test and poison every sum; it is
    no number a rule can use, so it reads as NULL (a missing value never matches)."""
    d = (
        F.when(is_number, as_double)
        .when(is_string & string.rlike(NUMERIC_RE), F.trim(string).try_cast("double"))
    )
    return F.when(F.abs(d) <= F.lit(_MAX_DOUBLE), d)


def _number_reading(text: Column, float_value: Column | None = None) -> Column:
    """A number value as DOUBLE, read from its JSON text `text`: the same double (the
    text of an integer, decimal or double variant parses to the correctly rounded
    double, as the variant's own conversion gives), but Spark 4.2 reads a variant scalar
    by building a Literal per row (validated against a SQLConf that an executor builds
    anew at each call) and, for an integer or decimal read as DOUBLE, a Cast expression
    too: that was 5% of the live job's JVM time, and 15% of its first stage's during a
    backlog drain (Flight Recorder). `float_value`: a FLOAT variant's own conversion
    (never made by parse_json), which its text would not give; None where the caller
    reads numbers from the JSON text it keeps (a FLOAT's text then)."""
    as_double = text.try_cast("double")
    return as_double if float_value is None else F.when(float_value.isNotNull(), float_value).otherwise(as_double)


def as_string(x: Column) -> Column:
    """The string, when the value is a JSON string; else NULL."""
    return _string_if(x, _text_kinds(json_text(x))[0])


def as_number(x: Column) -> Column:
    """A JSON number, or a numeric string, as DOUBLE; NULL for anything else (booleans too)."""
    text = json_text(x)
    is_string, is_number = _text_kinds(text)
    return _number_if(is_string, is_number, F.try_variant_get(x, "$", "string"), _number_reading(text))


# Event times the engine accepts: years 0001 to 9999, the range of Spark's timestamps.
# Outside it (1e30, -1e30, Infinity) a time is unusable, like an unparseable one: the
# record is a dead letter for the rules that need it, and no window arithmetic or
# timestamp conversion downstream can overflow.
MIN_EVENT_MS = -62_135_596_800_000
MAX_EVENT_MS = 253_402_300_799_999


def _in_range(ms: Column) -> Column:
    """Years 0001 to 9999 (docs/rule-language.md, "Timestamps"); others are unusable."""
    return (ms >= F.lit(MIN_EVENT_MS)) & (ms <= F.lit(MAX_EVENT_MS))


def epoch_to_ms(d: Column) -> Column:
    # The range is tested on the double, before floor (which a huge double would overflow).
    ms = F.when(d > F.lit(EPOCH_MS_CUTOFF), d).otherwise(d * F.lit(1000.0))
    return F.when(_in_range(ms), F.floor(ms).cast("long"))


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
    iso = F.floor(F.unix_micros(F.try_to_timestamp(text)) / F.lit(1000)).cast("long")
    return F.when(num.isNotNull(), epoch_to_ms(num)).otherwise(F.when(_in_range(iso), iso))


@dataclass(frozen=True)
class FieldValue:
    """The forms of one event value a comparison needs: JSON text (NULL when missing),
    number (numbers and numeric strings) and string (JSON strings only).

    Extracted fields (`extract_fields`) carry only the forms their rules read; the
    others are None, and `presence` says whether the value is there at all."""

    json: Column | None
    num: Column | None
    str: Column | None
    presence: Column | None = None
    # conditions.compare_spec's Columns over this value, by comparison.
    compared: dict = dataclass_field(default_factory=dict, compare=False, repr=False)

    @property
    def present(self) -> Column:
        return self.presence if self.presence is not None else self.json.isNotNull()


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


def field_needs(rules: Iterable[AnyRule]) -> tuple[dict[str, set[str]], set[str]]:
    """Which forms (`json`, `num`, `str`) of each value path `rules` read, and the
    timestamp paths. Each form costs a conversion per event, and most paths need one:
    a grouping key its JSON text, an amount its number, `type == "click"` its string."""
    from spark_jobs.engine.conditions import value_spec  # conditions imports this module

    needs: dict[str, set[str]] = {}
    times: set[str] = set()

    def need(path: str | None, *forms: str) -> None:
        if path:
            needs.setdefault(path, set()).update(forms)

    def condition(path: str, value: object) -> None:
        kind = value_spec(value)["kind"]
        need(path, {"num": "num", "bool": "json", "str": "str"}[kind])

    for r in rules:
        for c in getattr(r, "conditions", None) or []:
            condition(c.field, c.value)
        need(getattr(r, "group_by", None), "json")
        need(getattr(r, "correlation_key", None), "json")
        need(getattr(r, "event_value_field", None), "num")
        need(getattr(r, "context_value_field", None), "num", "json")
        if getattr(r, "context_type_field", None):
            condition(r.context_type_field, r.context_type_value)
        agg_field = getattr(r, "aggregation_field", None)
        if agg_field:
            agg = r.aggregation_type
            need(agg_field, *({"count": (), "distinct_count": ("json",)}.get(agg, ("num",))))
        if getattr(r, "timestamp_field", None):
            times.add(r.timestamp_field)
    return needs, times


class _ColumnRead:
    """extract_paths' reads as Spark expressions over each path's value (`x`, the
    step-one column): for any session, and for JSON paths (the live job's)."""

    def __init__(self, col: dict[str, dict[str, str]]) -> None:
        self.col = col
        self.x = {p: F.col(c["x"]) for p, c in col.items()}

    def first(self, v: Column, to_json_path: Callable[[str], str]) -> list[Column]:
        return [_variant_get(v, F.lit(to_json_path(p))).alias(self.col[p]["x"]) for p in self.col]

    def kind(self, p: str, present: Column) -> Column | None:
        """The value's variant type name, where the path's kind is not read from its JSON text."""
        return F.when(present, F.schema_of_variant(self.x[p])).alias(self.col[p]["kind"])

    def present(self, p: str) -> Column:
        return self.x[p].isNotNull() & ~F.is_variant_null(self.x[p])

    def json(self, p: str, present: Column) -> Column:
        return F.when(present, json_text(self.x[p]))

    def type_kinds(self, p: str) -> tuple[Column, Column]:
        return _type_kinds(F.col(self.col[p]["kind"]))

    def string_if(self, p: str, is_string: Column) -> Column:
        return _string_if(self.x[p], is_string)

    def number_reading(self, p: str) -> Column:
        # The text rendered for numbers only; a FLOAT by the variant's conversion.
        kind = F.col(self.col[p]["kind"])
        return F.when(kind == F.lit("FLOAT"), F.try_variant_get(self.x[p], "$", "double")).otherwise(
            _number_reading(json_text(self.x[p])))


class _JvmRead:
    """extract_paths' reads from the struct EventFields.read gives (see jvm_reads): the
    same values, read in the JVM in one call per event."""

    COLUMN = "__fr"

    def __init__(self, paths: list[str], reads: Column) -> None:
        self.reads = reads
        r = F.col(self.COLUMN)
        self.f = {p: {k: r[f"p{i}_{k}"] for k in ("present", "json", "is_str", "is_num", "str", "float")}
                  for i, p in enumerate(paths)}

    def first(self, v: Column, to_json_path: Callable[[str], str]) -> list[Column]:
        return [self.reads.alias(self.COLUMN)]

    def kind(self, p: str, present: Column) -> Column | None:
        return None  # the struct carries the kinds

    def present(self, p: str) -> Column:
        return self.f[p]["present"]

    def json(self, p: str, present: Column) -> Column:
        return self.f[p]["json"]

    def type_kinds(self, p: str) -> tuple[Column, Column]:
        return self.f[p]["is_str"], self.f[p]["is_num"]

    def string_if(self, p: str, is_string: Column) -> Column:
        return F.when(is_string, self.f[p]["str"])

    def number_reading(self, p: str) -> Column:
        return _number_reading(self.f[p]["json"], self.f[p]["float"])


# The field reads in the JVM (spark_jobs/jvm/processor, EventFields); `jvm_reads` says when.
READS_CLASS = "ruleplatform.keyed.EventFields"
FIELD_READS_CONF = "spark.rules.backtest.fieldReads"
# Which values' JSON text a path needs (EventFields.TEXT_*): none, numbers only, all.
_TEXT_NONE, _TEXT_NUMBERS, _TEXT_ALL = 0, 1, 2


def jvm_reads(spark: SparkSession, v: Column, paths: list[str], texts: list[int]) -> Column | None:
    """EventFields.read of the dotted `paths` over `v` (`texts`: which values' JSON text
    each path needs, the `_TEXT_*` codes), when the session can run it: a
    classic session (Spark Connect has no Py4J gateway) with the platform's jars, and
    `spark.rules.backtest.fieldReads` not `columns`. Otherwise extract_paths reads the
    fields as Spark expressions, with the same results: the eight fields of the
    benchmark's rules cost 2.2 s of a warm 1M-event scan that way (EventFields, README)."""
    if not paths or spark.conf.get(FIELD_READS_CONF, "jvm") == "columns":
        return None
    entry = jvm_class(spark, READS_CLASS)
    if entry is None:
        return None
    from pyspark.sql.classic.column import Column as ClassicColumn

    spec = json.dumps({"paths": [p.split(".") for p in paths], "texts": texts})
    return ClassicColumn(entry.read(v._jc, spec))


def extract_fields(
    df: DataFrame, rules: Iterable[AnyRule], time_paths: Iterable[str] = (), v: Column | None = None
) -> tuple[DataFrame, Fields]:
    """`df` plus one column per form of each field `rules` read (see Fields, field_needs)."""
    needs, times = field_needs(rules)
    return extract_paths(df, needs, times | set(time_paths), v)


def extract_paths(df: DataFrame, needs: dict[str, set[str]], times: Iterable[str] = (), v: Column | None = None,
                  to_json_path: Callable[[str], str] = json_path) -> tuple[DataFrame, Fields]:
    """`df` plus one column per form (`json`, `num`, `str`) in `needs` of each path, and
    epoch ms of each path in `times`. Paths are dotted rule paths, or anything
    `to_json_path` turns into a JSON path (the live job's rules carry JSON paths)."""
    v = F.col("v") if v is None else v
    needs = {p: set(f) for p, f in needs.items()}
    times = set(times)
    for p in times:
        needs.setdefault(p, set()).update(("num", "str"))
    paths = sorted(needs)
    # One projection per step, each reading the previous step's columns: written as one
    # expression, every form would look the path up and convert it again (Spark does
    # not share subexpressions inside CASE branches), several times per field and row.
    col = {p: {f: f"__f{i}_{f}" for f in ("x", "kind", "present", "json", "num", "str")} for i, p in enumerate(paths)}
    texts = [_TEXT_ALL if "json" in needs[p] else _TEXT_NUMBERS if "num" in needs[p] else _TEXT_NONE for p in paths]
    reads = jvm_reads(df.sparkSession, v, paths, texts) if to_json_path is json_path else None
    read = _JvmRead(paths, reads) if reads is not None else _ColumnRead(col)
    step1 = read.first(v, to_json_path)
    step2: list[Column] = []
    for p in paths:
        present = read.present(p)
        step2.append(present.alias(col[p]["present"]))
        if "json" in needs[p]:
            step2.append(read.json(p, present).alias(col[p]["json"]))
        elif needs[p] & {"num", "str"} and (kind := read.kind(p, present)) is not None:
            step2.append(kind)

    converted = [p for p in paths if needs[p] & {"num", "str"}]
    kinds = {p: _text_kinds(F.col(col[p]["json"])) if "json" in needs[p] else read.type_kinds(p) for p in converted}
    step3 = [read.string_if(p, kinds[p][0]).alias(col[p]["str"]) for p in converted]

    def reading(p: str) -> Column:
        return _number_reading(F.col(col[p]["json"])) if "json" in needs[p] else read.number_reading(p)

    step4 = [_number_if(*kinds[p], F.col(col[p]["str"]), reading(p)).alias(col[p]["num"])
             for p in converted if "num" in needs[p]]
    out = df
    for step in (step1, step2, step3, step4):
        if step:
            out = out.select("*", *step)

    def form(p: str, f: str) -> Column | None:
        return F.col(col[p][f]) if f in needs[p] else None

    values = {p: FieldValue(form(p, "json"), form(p, "num"), form(p, "str"), F.col(col[p]["present"])) for p in paths}
    keep = {col[p][f] for p in paths for f in ("present", *needs[p])}
    time_cols = {p: F.col(f"__t{i}") for i, p in enumerate(sorted(times))}
    if times:
        out = out.select("*", *[timestamp_of(values[p].num, values[p].str).alias(f"__t{i}")
                                for i, p in enumerate(sorted(times))])
    out = out.drop(*[c for c in out.columns if c.startswith("__f") and c not in keep])
    return out, Fields(values, time_cols)
