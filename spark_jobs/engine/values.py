"""How a rule reads an event: field paths, JSON-typed values, numbers and timestamps.

Spark Column expressions over the event parsed once into a VARIANT column, for what
reads an event's fields as a query: the event archive's time column, the data-quality
suites' columns, a backtest's `--time-field`. Rules themselves are judged by the
rule-set evaluator (`ruleplatform.rules`, spark_jobs/jvm), whose `Value` reads numbers,
numeric strings and times as these do (tests/integration/test_compiled_plan.py holds the
evaluator to the reference engine's reading of the spec).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

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
