"""What the event history a backtest reads must look like, derived from the rules.

The suite is built from the rules that read each topic, so it checks exactly what the
engine relies on: a record a velocity rule counts must carry its `group_by` key, an
event-time rule needs a parseable timestamp, a summed `aggregation_field` must hold
numbers. Each check is scoped to the records the rule actually looks at (its
pre-filter conditions, a correlation rule's context type), because one topic mixes
record types: an fx-rate context record has no `user_id`, and must not fail a check
that only user-reputation records have to pass. Specs are plain data (testable without
Great Expectations); runner.py turns them into a GX ExpectationSuite.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from spark_jobs.rules.model import AnyRule, Condition, CorrelationRule, ThresholdRule, VelocityRule

PRESENT = "present"
NUMERIC_TYPES = ["int", "float", "int64", "float64", "int32", "float32", "Int64", "Float64"]


def parsed_time_column(time_field: str) -> str:
    """Name of the derived column holding a timestamp field's epoch milliseconds."""
    return f"{time_field} (epoch ms)"


@dataclass
class FieldUse:
    """One field one or more rules need, on the records selected by `condition`."""

    field: str
    kind: str  # "time" | "key" | "numeric"
    condition: tuple[tuple[str, str, object], ...] = ()
    rules: set[str] = field(default_factory=set)

    @property
    def condition_text(self) -> str:
        return " and ".join(f"{f} is set" if op == PRESENT else f"{f} {op} {json.dumps(v)}" for f, op, v in self.condition)

    @property
    def pandas_query(self) -> str | None:
        """The condition as a DataFrame.query expression (GX `condition_parser="pandas"`)."""
        if not self.condition:
            return None
        # `x` == `x` is false exactly where x is missing (NaN/None): "x is set".
        return " and ".join(f"`{f}` == `{f}`" if op == PRESENT else f"`{f}` {op} {json.dumps(v)}" for f, op, v in self.condition)


@dataclass
class TopicFields:
    """The fields of one topic the rules depend on."""

    uses: list[FieldUse] = field(default_factory=list)

    def add(self, fld: str, kind: str, condition: tuple, rule_id: str) -> None:
        for u in self.uses:
            if u.field == fld and u.kind == kind and u.condition == condition:
                u.rules.add(rule_id)
                return
        self.uses.append(FieldUse(fld, kind, condition, {rule_id}))

    def of_kind(self, kind: str) -> set[str]:
        return {u.field for u in self.uses if u.kind == kind}

    @property
    def time_fields(self) -> set[str]:
        return self.of_kind("time")

    @property
    def condition_fields(self) -> set[str]:
        return {f for u in self.uses for f, _, _ in u.condition}

    @property
    def required(self) -> list[str]:
        return sorted({u.field for u in self.uses if u.kind in ("time", "key")})


@dataclass(frozen=True)
class ExpectationSpec:
    """One expectation: the GX class name, its arguments and a sentence for humans."""

    type: str
    kwargs: dict
    description: str


def _cond(conditions: Iterable[Condition]) -> tuple[tuple[str, str, object], ...]:
    return tuple((c.field, c.operator, c.value) for c in conditions)


def topic_fields(rules: Iterable[AnyRule], time_field: str = "timestamp") -> dict[str, TopicFields]:
    """Per topic, the fields the enabled rules read, each with the records it applies to."""
    out: dict[str, TopicFields] = {}

    def tf(topic: str) -> TopicFields:
        return out.setdefault(topic, TopicFields())

    for rule in rules:
        if not rule.enabled:
            continue
        src = tf(rule.source_topic)
        rid = rule.rule_id
        if isinstance(rule, ThresholdRule):
            continue  # stateless: a missing field simply never matches
        if isinstance(rule, VelocityRule):
            cond = _cond(rule.conditions)
            ts = rule.timestamp_field if rule.time_mode == "event_time" and rule.timestamp_field else time_field
            src.add(ts, "time", cond, rid)
            if rule.group_by:
                src.add(rule.group_by, "key", cond, rid)
            if rule.aggregation_field and rule.aggregation_type != "distinct_count":
                src.add(rule.aggregation_field, "numeric", cond, rid)
        elif isinstance(rule, CorrelationRule):
            ctx = tf(rule.context_topic)
            ctx_cond: tuple = ()
            if rule.context_type_field is not None:
                ctx_cond = ((rule.context_type_field, "==", rule.context_type_value),)
            ctx.add(rule.timestamp_field, "time", ctx_cond, rid)
            ctx.add(rule.correlation_key, "key", ctx_cond, rid)
            ctx.add(rule.context_value_field, "numeric", ctx_cond, rid)
            if rule.velocity_filter_rule_id is None:
                # Primaries are the source records that carry the correlation key (a
                # record without it is simply not correlated); a velocity filter's
                # records are already covered by that velocity rule's checks.
                key_set = ((rule.correlation_key, PRESENT, None),)
                src.add(rule.timestamp_field, "time", key_set, rid)
                if rule.event_value_field:
                    src.add(rule.event_value_field, "numeric", key_set, rid)
    return out


class SparkDialect:
    """How the suite reads a Spark DataFrame instead of pandas (GX's Spark datasource):
    row conditions are Spark SQL (`condition_parser="spark"`) over columns the Spark
    quality runner derives from the events' VARIANT with the engine's own conversions,
    and "holds numbers" is "the engine reads a number" (GX's type-list expectation
    checks a Spark column's declared type, not each value)."""

    @staticmethod
    def column(path: str) -> str:
        """A field's column: dots would read as struct access in Spark."""
        return path.replace(".", "/")

    @staticmethod
    def number_column(path: str) -> str:
        return f"{SparkDialect.column(path)} (number)"

    @staticmethod
    def condition_column(path: str, form: str) -> str:
        return f"{SparkDialect.column(path)} ({form})"

    @staticmethod
    def condition_pandas(use: FieldUse) -> str | None:
        """The condition as a DataFrame.query over the same derived columns, for GX's
        pandas engine on a window collected from Spark (`x != x`: x is missing)."""
        if not use.condition:
            return None
        parts = []
        for f, op, v in use.condition:
            if op == PRESENT:
                col = SparkDialect.column(f)
                parts.append(f"`{col}` == `{col}`")
            elif isinstance(v, bool):
                parts.append(f"`{SparkDialect.condition_column(f, 'json')}` {op} {json.dumps(json.dumps(v))}")
            elif isinstance(v, int | float):
                parts.append(f"`{SparkDialect.condition_column(f, 'num')}` {op} {float(v)!r}")
            else:
                parts.append(f"`{SparkDialect.condition_column(f, 'str')}` {op} {json.dumps(str(v))}")
        return " and ".join(parts)

    @staticmethod
    def condition_sql(use: FieldUse) -> str | None:
        if not use.condition:
            return None
        ops = {"==": "=", "!=": "<>"}
        parts = []
        for f, op, v in use.condition:
            if op == PRESENT:
                parts.append(f"`{SparkDialect.column(f)}` IS NOT NULL")
            elif isinstance(v, bool):
                parts.append(f"`{SparkDialect.condition_column(f, 'json')}` {ops.get(op, op)} '{json.dumps(v)}'")
            elif isinstance(v, int | float):
                parts.append(f"`{SparkDialect.condition_column(f, 'num')}` {ops.get(op, op)} {float(v)!r}")
            else:
                text = str(v).replace("\\", "\\\\").replace("'", "\\'")
                parts.append(f"`{SparkDialect.condition_column(f, 'str')}` {ops.get(op, op)} '{text}'")
        return " AND ".join(parts)


def _scope(use: FieldUse, spark: bool = False, parser: str = "spark") -> tuple[dict, str]:
    kwargs: dict = {}
    if spark and use.condition:
        cond = SparkDialect.condition_pandas(use) if parser == "pandas" else SparkDialect.condition_sql(use)
        kwargs = {"row_condition": cond, "condition_parser": parser}
    elif use.pandas_query:
        kwargs = {"row_condition": use.pandas_query, "condition_parser": "pandas"}
    who = ", ".join(sorted(use.rules))
    where = f" where {use.condition_text}" if use.condition else ""
    return kwargs, f" (for {who}{where})"


def suite_specs(
    fields: TopicFields, window_ms: tuple[int, int] | None, spark: bool = False, parser: str = "spark"
) -> list[ExpectationSpec]:
    """The expectations for one topic; `window_ms` bounds the event timestamps. `spark`:
    the same checks over the columns Spark derives (SparkDialect), their row conditions
    in Spark SQL, or with `parser` "pandas" as DataFrame.query (GX's pandas engine on
    those columns collected to the driver)."""
    name = SparkDialect.column if spark else (lambda p: p)
    specs = [ExpectationSpec("ExpectTableRowCountToBeBetween", {"min_value": 1}, "the history of this topic is not empty")]
    if fields.required:
        specs.append(
            ExpectationSpec(
                "ExpectTableColumnsToMatchSet",
                {"column_set": [name(f) for f in fields.required], "exact_match": False},
                f"required fields are present: {', '.join(fields.required)}",
            )
        )
    order = {"time": 0, "key": 1, "numeric": 2}
    for use in sorted(fields.uses, key=lambda u: (order[u.kind], u.field, u.condition_text)):
        scope, why = _scope(use, spark, parser)
        if use.kind == "time":
            col = parsed_time_column(use.field)
            specs.append(
                ExpectationSpec(
                    "ExpectColumnValuesToNotBeNull",
                    {"column": col, **scope},
                    f"timestamp '{use.field}' is set and parseable (ISO-8601 or epoch){why}",
                )
            )
            if window_ms is not None:
                specs.append(
                    ExpectationSpec(
                        "ExpectColumnValuesToBeBetween",
                        {"column": col, "min_value": window_ms[0], "max_value": window_ms[1], **scope},
                        f"timestamp '{use.field}' is within the history window{why}",
                    )
                )
        elif use.kind == "key":
            specs.append(
                ExpectationSpec("ExpectColumnValuesToNotBeNull", {"column": name(use.field), **scope},
                                f"key field '{use.field}' is not null{why}")
            )
        elif spark:
            # Among the records where the engine reads no number, the value must be
            # missing: what is there instead is the unexpected value (shown as a sample).
            num = SparkDialect.number_column(use.field)
            no_number, and_ = (f"`{num}` != `{num}`", "and") if parser == "pandas" else (f"`{num}` IS NULL", "AND")
            cond = scope.get("row_condition")
            specs.append(
                ExpectationSpec(
                    "ExpectColumnValuesToBeNull",
                    {"column": SparkDialect.column(use.field), "condition_parser": parser,
                     "row_condition": f"{no_number} {and_} ({cond})" if cond else no_number},
                    f"value field '{use.field}' holds numbers{why}",
                )
            )
        else:
            specs.append(
                ExpectationSpec(
                    "ExpectColumnValuesToBeInTypeList",
                    {"column": use.field, "type_list": NUMERIC_TYPES, **scope},
                    f"value field '{use.field}' holds numbers{why}",
                )
            )
    return specs
