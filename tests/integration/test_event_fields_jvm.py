"""The backtest's field reads in the JVM (EventFields) against the same reads as Spark
expressions (values.extract_paths with `spark.rules.backtest.fieldReads=columns`, the
route Spark Connect sessions take): every form of every path, over values chosen to
tell the two apart (escapes, numeric strings, numbers of each kind, nulls, nesting,
records that are not objects or not JSON)."""

from __future__ import annotations

import json

import pytest
from pyspark.sql import functions as F

from spark_jobs.engine.events import parse_variant
from spark_jobs.engine.values import FIELD_READS_CONF, extract_paths, jvm_reads

pytestmark = pytest.mark.spark

VALUES = [
    "plain", "", "say \"hi\"", "back\\slash", "tab\there", "line\nbreak", "\u0001ctl", "caf\u00e9 \u2603 \U0001f600",
    " 12 ", "1e3", "-0.5", "+7", ".5", "1_000", "NaN", "inf", "1e400", "0x10", "12abc",
    0, -3, 42, 2**53 + 1, 2**63 - 1, -(2**63), 0.1, 1.50, -2.5e-7, 1e308, 123456789.123456789,
    True, False, None, [1, "a"], {"k": "v"}, {},
    "2026-01-02T03:04:05Z", "2026-01-02 03:04:05+02:00", 1767225600, 1767225600123,
]
# Text parse_json reads as numbers that no Python float spells: big integers and decimals.
RAW_NUMBERS = ["123456789012345678901234567890", "1.000000000000000000001", "-0", "1E2", "1e-400"]

PATHS = ["a", "b", "n.x", "n.y.z", "missing", "n.missing", "q\"uote", "ts"]


def _records() -> list[str]:
    out = []
    for i, v in enumerate(VALUES):
        out.append(json.dumps({"a": v, "b": i, "n": {"x": v, "y": {"z": v}}, "q\"uote": v, "ts": v}))
    for i, text in enumerate(RAW_NUMBERS):
        out.append(f'{{"a": {text}, "b": {i}, "n": {{"x": {text}, "y": {{"z": {text}}}}}, "ts": {text}}}')
    # More record shapes (key sets) than EventFields keeps key ids for (64), in turn.
    out += [json.dumps({f"k{i}": i, "a": f"s{i}", "n": {"x": i, f"y{i % 3}": {"z": -i}}}) for i in range(100)]
    # Not an object at the root, nested non-objects on the path, and not JSON at all.
    out += ["[1, 2]", '"text"', "17", "null", '{"n": 5, "a": null}', '{"n": [1], "a": {"b": 1}}', "{not json", ""]
    return out


def _read(spark, mode: str, needs: dict[str, set[str]], times: set[str]) -> list[dict]:
    spark.conf.set(FIELD_READS_CONF, mode)
    spark.conf.set("spark.sql.debug.maxToStringFields", "1000")  # the whole projection in the plan's text
    try:
        rows = [(i, r) for i, r in enumerate(_records())]
        df = spark.createDataFrame(rows, "i int, raw string").withColumn("v", parse_variant(F.col("raw")))
        out, fields = extract_paths(df, needs, times)
        cols = ["i"]
        for p in sorted(needs):
            value = fields.value(p)
            cols += [value.present.alias(f"{p}.present")]
            cols += [c.alias(f"{p}.{name}") for name, c in (("json", value.json), ("num", value.num), ("str", value.str))
                     if c is not None]
        cols += [fields.time(p).alias(f"{p}.time") for p in sorted(times)]
        if mode == "jvm":
            # The JVM route is what ran, not a silent fallback to the expressions.
            assert "event_fields(" in out._jdf.queryExecution().executedPlan().toString()
        return [r.asDict() for r in out.select(*cols).orderBy("i").collect()]
    finally:
        spark.conf.unset(FIELD_READS_CONF)
        spark.conf.unset("spark.sql.debug.maxToStringFields")


@pytest.mark.parametrize("forms", [{"json", "num", "str"}, {"json"}, {"num"}, {"str"}, {"num", "str"}, {"json", "num"}])
def test_jvm_reads_equal_the_expressions(spark, forms: set[str]) -> None:
    needs = {p: set(forms) for p in PATHS}
    expected = _read(spark, "columns", needs, {"ts"})
    got = _read(spark, "jvm", needs, {"ts"})
    assert len(got) == len(_records())
    # The oracle reads what the rule language says (so equal is not vacuous).
    at = {v if isinstance(v, str) else json.dumps(v): expected[i] for i, v in enumerate(VALUES)}
    assert at["plain"]["a.present"] and not at["null"]["a.present"] and not at["plain"]["missing.present"]
    if "str" in forms:
        assert at["plain"]["n.y.z.str"] == "plain" and at["42"]["a.str"] is None
    if "json" in forms:
        assert at['say "hi"']["a.json"] == '"say \\"hi\\""' and at["42"]["n.x.json"] == "42"
    if "num" in forms:
        assert at[" 12 "]["a.num"] == 12.0 and at["1e400"]["a.num"] is None and at["true"]["a.num"] is None
    for e, g in zip(expected, got, strict=True):
        assert g == e, f"record {_records()[e['i']]!r}: jvm {g} != expressions {e}"


def test_jvm_reads_need_a_classic_session_with_the_jars(spark) -> None:
    """The platform's sessions load EventFields; the switch turns it off."""
    assert jvm_reads(spark, F.col("v"), ["a"], [2]) is not None
    spark.conf.set(FIELD_READS_CONF, "columns")
    try:
        assert jvm_reads(spark, F.col("v"), ["a"], [2]) is None
    finally:
        spark.conf.unset(FIELD_READS_CONF)
