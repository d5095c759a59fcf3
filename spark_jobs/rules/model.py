"""The rule language of DESIGN.md as pydantic models.

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
_RULE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")

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

    field: FieldPath
    operator: Operator
    value: ScalarValue


class MetricCondition(_Strict):
    """The single `{operator, value}` a correlation rule applies to its metric."""

    operator: Operator
    value: ScalarValue


class _RuleBase(_Strict):
    rule_id: Annotated[str, Field(min_length=1, max_length=200, pattern=_RULE_ID.pattern)]
    # YAML reads `version: 3` as an int; a version is an opaque label, so ints are
    # accepted and kept as their decimal string.
    version: Annotated[str, Field(min_length=1, max_length=64)]
    source_topic: TopicName
    name: Text | None = None
    description: Text | None = None
    enabled: StrictBool = True
    tags: Annotated[list[Annotated[StrictStr, Field(max_length=100)]], Field(max_length=MAX_TAGS)] = Field(
        default_factory=list)
    owner: Annotated[str, Field(max_length=200)] | None = None

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
    rule_type: Literal["threshold"]
    conditions: Annotated[list[Condition], Field(min_length=1, max_length=MAX_CONDITIONS)]


class VelocityRule(_RuleBase):
    rule_type: Literal["velocity"]
    window_size: PositiveNumber
    window_unit: WindowUnit
    aggregation_type: AggregationType
    threshold: Number
    group_by: FieldPath | None = None
    aggregation_field: FieldPath | None = None
    conditions: Annotated[list[Condition], Field(max_length=MAX_CONDITIONS)] = Field(default_factory=list)
    emit_mode: Literal["last_event", "all_events"] = "last_event"
    time_mode: Literal["processing_time", "event_time"] = "processing_time"
    timestamp_field: FieldPath | None = None
    watermark_delay: WatermarkDelay = DEFAULT_WATERMARK_DELAY_S
    emit_to_sink: StrictBool = True

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
    rule_type: Literal["correlation"]
    context_topic: TopicName
    correlation_key: FieldPath
    window_size: PositiveNumber
    window_unit: WindowUnit
    context_resolution: Literal["last", "mean", "mean_std"]
    context_value_field: FieldPath
    timestamp_field: FieldPath
    condition: MetricCondition
    metric: Literal["direct", "ratio_deviation", "difference", "z_score"] = "direct"
    event_value_field: FieldPath | None = None
    emit_mode: Literal["event", "context", "both"] = "both"
    context_type_field: FieldPath | None = None
    context_type_value: ScalarValue | None = None
    velocity_filter_rule_id: Annotated[str, Field(max_length=200)] | None = None
    max_context_age_seconds: Annotated[PositiveNumber, Field(le=MAX_WINDOW_MS // 1000)] | None = None
    min_context_points: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 1
    watermark_delay: WatermarkDelay = DEFAULT_WATERMARK_DELAY_S

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
    """The canonical JSON form: what is published to `rules.active` and compared."""
    return rule.model_dump(mode="json")


def rule_json_schema() -> dict:
    schema = RULE_ADAPTER.json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Detection rule"
    schema["description"] = (
        "A threshold, velocity or correlation rule (see DESIGN.md). Generated from "
        "spark_jobs.rules.model by `rulectl schema`; do not edit by hand."
    )
    return schema


def job_watermark_delay_s(rules: list[AnyRule]) -> float:
    """The job's bounded out-of-orderness: max delay over rules that use event time."""
    delays = [
        d for r in rules if r.enabled and (d := r.watermark_delay_s) is not None
    ]
    return max(delays, default=0.0)
