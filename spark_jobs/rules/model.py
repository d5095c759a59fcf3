"""The rule language (docs/rule-language.md) as pydantic models.

These models are the single source of truth for what a rule is: `rulectl validate`,
the JSON Schema in `rules/schema/rule.schema.json`, the publisher and both Spark jobs
all go through them, so a rule that validates here is a rule the engine can run.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    field_validator,
    model_validator,
)

Operator = Literal["==", "!=", ">", "<", ">=", "<="]
WindowUnit = Literal["seconds", "minutes", "hours", "days"]
AggregationType = Literal["count", "sum", "avg", "min", "max", "distinct_count"]

UNIT_MS: dict[str, int] = {
    "seconds": 1_000,
    "minutes": 60_000,
    "hours": 3_600_000,
    "days": 86_400_000,
}

DEFAULT_WATERMARK_DELAY_S = 5.0

# Limits: what the engine can represent and a running job can carry. A rule outside them
# is rejected with the field and the reason, in `rulectl validate` and in the job alike
# (the job's registry validates every record of `rules.active` with this model).
# * Windows, lookbacks and context ages up to 366 days: a window is added to and
#   subtracted from epoch-millisecond event times, and state is kept for it.
# * Watermark delays up to 7 days: the delay is how long the job holds state for late
#   data, and it is one value for the whole job.
# * Numbers: finite, and integers within +-2**53, the range in which a double (what the
#   engine compares and sums) holds an integer exactly. 1e400, NaN and Infinity are not
#   numbers a rule can use.
# * Sizes: a rule rides along with every micro-batch, so text fields and lists are
#   bounded (a 1 MB description is a mistake, not a rule).
MAX_WINDOW_MS = 366 * UNIT_MS["days"]
MAX_WATERMARK_DELAY_S = 7 * 24 * 3600
MAX_EXACT_INT = 2**53
MAX_TEXT = 2_000
MAX_VALUE_TEXT = 1_000
MAX_PATH = 256
MAX_CONDITIONS = 50
MAX_TAGS = 50


def _finite_number(v: float) -> float:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        if abs(v) > MAX_EXACT_INT:
            raise ValueError(f"integer out of range: |value| must be at most 2**53 ({MAX_EXACT_INT})")
        return v
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError("must be a finite number (not NaN or Infinity)")
    return v


# A dotted path into nested JSON: `user.id`, `payload.amount`. Segments are plain keys;
# empty segments (`a..b`, `.a`) are almost always typos, so they are rejected.
_PATH = re.compile(r"^[^.\s]+(\.[^.\s]+)*$")
RULE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")

Number = Annotated[StrictInt | StrictFloat, AfterValidator(_finite_number)]
ScalarValue = StrictBool | Number | Annotated[StrictStr, Field(max_length=MAX_VALUE_TEXT)]
FieldPath = Annotated[str, Field(min_length=1, max_length=MAX_PATH, pattern=_PATH.pattern)]
PositiveNumber = Annotated[Number, Field(gt=0)]
NonNegativeNumber = Annotated[Number, Field(ge=0)]
WatermarkDelay = Annotated[Number, Field(ge=0, le=MAX_WATERMARK_DELAY_S)]
Text = Annotated[str, Field(max_length=MAX_TEXT)]
TopicName = Annotated[str, Field(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._\-]+$")]


class _Strict(BaseModel):
    # Unknown keys are rejected: a misspelt optional field (`group-by`) would otherwise
    # be silently ignored and the rule would mean something its author did not write.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Condition(_Strict):
    """One `{field, operator, value}` test; a rule's conditions are ANDed."""

    field: FieldPath = Field(
        description="Dotted path of the event value to test (`type`, `user.id`); a missing value or JSON null "
        "never matches.")
    operator: Operator = Field(
        description="Comparison: `==`, `!=`, `>`, `<`, `>=` or `<=`. A number and a numeric string compare as "
        "numbers; the ordering operators never match a value that is not a number.")
    value: ScalarValue = Field(
        description="The value compared with: a string (up to 1,000 characters), a finite number or a boolean.")


class MetricCondition(_Strict):
    """The single `{operator, value}` a correlation rule applies to its metric."""

    operator: Operator = Field(description="Comparison of the metric with `value`: `==`, `!=`, `>`, `<`, `>=`, `<=`.")
    value: ScalarValue = Field(
        description="The value the metric is compared with; a number unless the metric is `direct` over `last` "
        "context (then a string or boolean is compared by JSON value with `==`/`!=`).")


class _RuleBase(_Strict):
    rule_id: Annotated[str, Field(min_length=1, max_length=200, pattern=RULE_ID.pattern)] = Field(
        description="Unique id of the rule across the rule set (letters, digits, `_`, `.`, `-`); the Kafka key "
        "of its record on rules.active.")
    # YAML reads `version: 3` as an int; a version is an opaque label, so ints are
    # accepted and kept as their decimal string.
    version: Annotated[str, Field(min_length=1, max_length=64)] = Field(
        description="Version label; a higher version replaces the rule in the running job. Ordered like software "
        "versions (`2` < `10`, `1.9` < `1.10`); an integer is kept as its decimal string.")
    source_topic: TopicName = Field(description="Kafka topic whose events the rule evaluates.")
    name: Text | None = Field(None, description="Human-readable name; copied to detections as `rule_name`.")
    description: Text | None = Field(None, description="Free text for people; not used by the engine.")
    enabled: StrictBool = Field(True, description="false removes the rule from the running job.")
    tags: Annotated[list[Annotated[StrictStr, Field(max_length=100)]], Field(max_length=MAX_TAGS)] = Field(
        default_factory=list, description="Labels for people and reports (up to 50); not used by the engine.")
    owner: Annotated[str, Field(max_length=200)] | None = Field(
        None, description="Team or person responsible for the rule; not used by the engine.")
    mode: Literal["active", "shadow"] = Field(
        "active", description="`shadow`: the version runs in the live job beside the version in force, on the "
        "same events, and its detections go to the shadow topic (`events.shadow`), never to the sink. Published "
        "as the record `<rule_id>@shadow` of rules.active; releasing an active version of the rule ends it.")

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_string(cls, v: object) -> object:
        if isinstance(v, bool):
            return v  # rejected by the str type below, with pydantic's message
        if isinstance(v, int):
            return str(v)
        return v

    # Helpers shared by the engine; kept on the model so every caller agrees.
    @property
    def live_id(self) -> str:
        """The rule's name in the live job and its key on rules.active: the rule id, or
        `<rule_id>@shadow` for a shadow version (`@` is no rule id character), so a
        shadow has state, a status entry and a record of its own beside the version
        in force."""
        return shadow_id(self.rule_id) if self.mode == "shadow" else self.rule_id

    @property
    def window_ms(self) -> int:
        """Window (velocity) or lookback (correlation) in milliseconds; 0 for threshold."""
        size, unit = getattr(self, "window_size", None), getattr(self, "window_unit", None)
        return _window_ms(size, unit) if size is not None and unit is not None else 0

    @property
    def uses_event_time(self) -> bool:
        return False

    @property
    def watermark_delay_s(self) -> float | None:
        """The delay this rule contributes to the job watermark, or None."""
        return None


class ThresholdRule(_RuleBase):
    """Stateless: every event of `source_topic` that passes all conditions is a detection."""

    rule_type: Literal["threshold"] = Field(description="`threshold`: a stateless test of each event.")
    conditions: Annotated[list[Condition], Field(min_length=1, max_length=MAX_CONDITIONS)] = Field(
        description="One to 50 conditions, ANDed.")


class VelocityRule(_RuleBase):
    """A sliding window per key, evaluated at every event that enters it."""

    rule_type: Literal["velocity"] = Field(description="`velocity`: an aggregate over a sliding window per key.")
    window_size: PositiveNumber = Field(
        description="Window length in `window_unit`; the window at an event at time t holds the key's events "
        "with time in (t - window, t]. From 1 ms to 366 days.")
    window_unit: WindowUnit = Field(description="Unit of `window_size`: seconds, minutes, hours or days.")
    aggregation_type: AggregationType = Field(
        description="Aggregate over the window: count, sum, avg, min, max or distinct_count.")
    threshold: Number = Field(description="The rule fires when the aggregate is at or above this value.")
    group_by: FieldPath | None = Field(
        None, description="Dotted path of the key (compared by JSON value); absent: one global window per rule. "
        "An event without the value does not enter the window.")
    aggregation_field: FieldPath | None = Field(
        None, description="Dotted path of the aggregated value; required for every aggregation but count. An "
        "event without the value (or, for sum/avg/min/max, without a numeric one) does not enter the window.")
    conditions: Annotated[list[Condition], Field(max_length=MAX_CONDITIONS)] = Field(
        default_factory=list, description="Pre-filter, ANDed: only events passing all of them enter the window.")
    emit_mode: Literal["last_event", "all_events"] = Field(
        "last_event", description="`last_event`: emit once per crossing (at or above the threshold now, below "
        "or no previous evaluation in the window before); `all_events`: emit every event at which the aggregate "
        "is at or above the threshold.")
    time_mode: Literal["processing_time", "event_time"] = Field(
        "processing_time", description="`processing_time`: the record's broker timestamp (live) or the "
        "backtest's processing time; `event_time`: the event's `timestamp_field`, under the job watermark.")
    timestamp_field: FieldPath | None = Field(
        None, description="Dotted path of the event time (ISO-8601 or epoch); required for event_time.")
    watermark_delay: WatermarkDelay = Field(
        DEFAULT_WATERMARK_DELAY_S, description="Seconds of out-of-orderness tolerated (event_time only; 0 to 7 "
        "days); the job watermark is the maximum over its rules.")
    emit_to_sink: StrictBool = Field(
        True, description="false: emits go only to the correlation rules that name this rule in "
        "`velocity_filter_rule_id`, never to the sink.")
    warm_start: StrictBool = Field(
        True, description="true: a version whose window starts afresh in the running job (a new rule, new "
        "conditions, grouping or window) first fills it from the event archive, so it judges its first events "
        "as if it had run all along; false: it starts with empty windows.")

    @model_validator(mode="after")
    def _required_together(self) -> VelocityRule:
        if self.aggregation_type != "count" and not self.aggregation_field:
            raise _field_error(
                "aggregation_field",
                f"required when aggregation_type is {self.aggregation_type!r}",
            )
        if self.time_mode == "event_time" and not self.timestamp_field:
            raise _field_error("timestamp_field", "required when time_mode is 'event_time'")
        _check_window_ms(self.window_size, self.window_unit)
        return self

    @property
    def uses_event_time(self) -> bool:
        return self.time_mode == "event_time"

    @property
    def watermark_delay_s(self) -> float | None:
        return float(self.watermark_delay) if self.uses_event_time else None


class CorrelationRule(_RuleBase):
    """A primary event judged against context records of the same key."""

    rule_type: Literal["correlation"] = Field(
        description="`correlation`: a primary event compared with context of the same key.")
    context_topic: TopicName = Field(description="Kafka topic of the context records.")
    correlation_key: FieldPath = Field(
        description="Dotted path of the key, read from primaries and context records alike; compared by JSON "
        "value (1 and \"1\" differ).")
    window_size: PositiveNumber = Field(
        description="Lookback in `window_unit`: a primary at t sees context with time in [t - lookback, t]. "
        "From 1 ms to 366 days.")
    window_unit: WindowUnit = Field(description="Unit of `window_size`: seconds, minutes, hours or days.")
    context_resolution: Literal["last", "mean", "mean_std"] = Field(
        description="`last`: the latest context record at or before the primary; `mean` / `mean_std`: mean "
        "(and population std) of the numeric context values in the lookback.")
    context_value_field: FieldPath = Field(description="Dotted path of the value in a context record.")
    timestamp_field: FieldPath = Field(
        description="Dotted path of the event time, in primaries and context records alike (ISO-8601 or epoch).")
    condition: MetricCondition = Field(description="The `{operator, value}` test applied to the metric.")
    metric: Literal["direct", "ratio_deviation", "difference", "z_score"] = Field(
        "direct", description="`direct`: the resolved context value; `ratio_deviation`: |event/context - 1|; "
        "`difference`: event - context; `z_score`: (event - mean)/std, needs `mean_std`.")
    event_value_field: FieldPath | None = Field(
        None, description="Dotted path of the primary's value; required for every metric but direct.")
    emit_mode: Literal["event", "context", "both"] = Field(
        "both", description="`event`: the detection carries the event and the rule members; `context` and "
        "`both`: also the `context` member (the context record used, or {mean, std, count}).")
    context_type_field: FieldPath | None = Field(
        None, description="With `context_type_value`: only context records whose value here equals it count.")
    context_type_value: ScalarValue | None = Field(
        None, description="The value `context_type_field` must equal (compared like `==`); set both or neither.")
    velocity_filter_rule_id: Annotated[str, Field(max_length=200)] | None = Field(
        None, description="Take primaries from the emits of this velocity rule (which must have "
        "`emit_to_sink: false` and the same `source_topic`) instead of every event of `source_topic`.")
    max_context_age_seconds: Annotated[PositiveNumber, Field(le=MAX_WINDOW_MS // 1000)] | None = Field(
        None, description="Narrows the lookback: context older than this many seconds before the primary "
        "is not used.")
    min_context_points: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = Field(
        1, description="For `mean` / `mean_std`: fewest numeric context values needed for a decision.")
    watermark_delay: WatermarkDelay = Field(
        DEFAULT_WATERMARK_DELAY_S, description="Seconds of out-of-orderness tolerated (0 to 7 days); the job "
        "watermark is the maximum over its rules.")
    warm_start: StrictBool = Field(
        True, description="true: a version whose context starts afresh in the running job first fills it from "
        "the event archive (the context records of its lookback); false: it starts without context.")

    @model_validator(mode="after")
    def _required_together(self) -> CorrelationRule:
        if self.metric != "direct" and not self.event_value_field:
            raise _field_error("event_value_field", f"required when metric is {self.metric!r}")
        if self.metric == "z_score" and self.context_resolution != "mean_std":
            raise _field_error(
                "metric", "z_score needs context_resolution 'mean_std' (it divides by the std)"
            )
        if (self.context_type_field is None) != (self.context_type_value is None):
            missing = "context_type_value" if self.context_type_value is None else "context_type_field"
            raise _field_error(missing, "context_type_field and context_type_value go together")
        computed = self.metric != "direct" or self.context_resolution != "last"
        if computed and isinstance(self.condition.value, (bool, str)):
            raise _field_error("condition.value", "must be a number for a computed metric or a mean")
        _check_window_ms(self.window_size, self.window_unit)
        return self

    @property
    def lookback_ms(self) -> int:
        """Effective lookback: the window, narrowed by max_context_age_seconds."""
        if self.max_context_age_seconds is None:
            return self.window_ms
        return min(self.window_ms, int(round(self.max_context_age_seconds * 1000)))

    @property
    def uses_event_time(self) -> bool:
        return True

    @property
    def watermark_delay_s(self) -> float | None:
        return float(self.watermark_delay)


Rule = Annotated[
    ThresholdRule | VelocityRule | CorrelationRule, Field(discriminator="rule_type")
]
RULE_ADAPTER: TypeAdapter[ThresholdRule | VelocityRule | CorrelationRule] = TypeAdapter(Rule)
AnyRule = ThresholdRule | VelocityRule | CorrelationRule


class _FieldError(ValueError):
    """A model-level check that belongs to one field, so the error can name it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def _field_error(field: str, reason: str) -> _FieldError:
    return _FieldError(field, reason)


def _window_ms(size: float, unit: str) -> int:
    return int(round(size * UNIT_MS[unit]))


def _check_window_ms(size: float, unit: str) -> None:
    # Compared in float first: a huge size times the unit must not reach int().
    if size * UNIT_MS[unit] > MAX_WINDOW_MS:
        raise _field_error("window_size", f"window must be at most 366 days, got {size} {unit}")
    if _window_ms(size, unit) < 1:
        raise _field_error("window_size", "window must be at least 1 millisecond")


def parse_rule(data: object) -> AnyRule:
    """Validate one rule mapping; raises pydantic.ValidationError."""
    return RULE_ADAPTER.validate_python(data)


def rule_to_json_dict(rule: AnyRule) -> dict:
    """The canonical JSON form: what is published to `rules.active` and compared. The
    defaults `mode` (active) and `warm_start` (true) are left out, so the form of every
    rule written before they existed is unchanged."""
    d = rule.model_dump(mode="json")
    if d.get("mode") == "active":
        del d["mode"]
    if d.get("warm_start") is True:
        del d["warm_start"]
    return d


SHADOW_SUFFIX = "@shadow"


def shadow_id(rule_id: str) -> str:
    return rule_id + SHADOW_SUFFIX


def base_id(live_id: str) -> str:
    """`<rule_id>@shadow` -> `<rule_id>`; a rule id as it is."""
    return live_id.removesuffix(SHADOW_SUFFIX)


def rule_json_schema() -> dict:
    schema = RULE_ADAPTER.json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Detection rule"
    schema["description"] = (
        "A threshold, velocity or correlation rule (see docs/rule-language.md). Generated from "
        "spark_jobs.rules.model by `rulectl schema`; do not edit by hand."
    )
    return schema


def job_watermark_delay_s(rules: list[AnyRule]) -> float:
    """The job's bounded out-of-orderness: max delay over rules that use event time."""
    delays = [
        d for r in rules if r.enabled and (d := r.watermark_delay_s) is not None
    ]
    return max(delays, default=0.0)
