"""Conditions (`{field, operator, value}`) compiled to Spark Column expressions.

Semantics (DESIGN.md, "Fine points"): a missing field (or JSON null) never matches;
a number and a numeric string compare as numbers for every operator; ordering
operators on non-numeric values never match; otherwise `==`/`!=` compare JSON values.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_jobs.engine.values import NUMERIC_RE, FieldValue, field, field_value
from spark_jobs.rules.model import Condition

_NUMERIC = re.compile(NUMERIC_RE)



def rule_value_number(value: object) -> float | None:
    """The number a rule value stands for, if it is a number or a numeric string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and _NUMERIC.match(value):
        f = float(value)
        return f if math.isfinite(f) else None
    return None


def value_spec(value: object) -> dict[str, object]:
    """A rule value as data: its kind (`num`, `str`, `bool`) and its typed forms.

    The streaming job ships conditions to Spark as rows of this shape, so one
    expression (`compare_spec`) serves literal and data-driven conditions alike.
    """
    num = rule_value_number(value)
    if num is not None:
        return {"kind": "num", "num": num, "str": None, "bool": None}
    if isinstance(value, bool):
        return {"kind": "bool", "num": None, "str": None, "bool": value}
    return {"kind": "str", "num": None, "str": str(value), "bool": None}


def compare_spec(x: FieldValue, op: Column, kind: Column, num: Column, text: Column, flag: Column) -> Column:
    """`x <op> value` with the operator and the value given as Columns; never NULL.

    With literal arguments Spark's optimizer folds the CASE branches away, so the
    compiled form costs the same as a hand-written comparison.
    """
    a = x.num
    present = x.present
    numeric = (
        F.when(op == "==", a.isNotNull() & (a == num))
        # A present value that is not a number is "not equal" to a number.
        .when(op == "!=", present & (a.isNull() | (a != num)))
        .when(op == ">", a.isNotNull() & (a > num))
        .when(op == "<", a.isNotNull() & (a < num))
        .when(op == ">=", a.isNotNull() & (a >= num))
        .when(op == "<=", a.isNotNull() & (a <= num))
    )
    same = F.coalesce(
        F.when(kind == "bool", x.json == F.when(flag, F.lit("true")).otherwise(F.lit("false")))
        .otherwise(x.str == text),
        F.lit(False),
    )
    other = F.when(op == "==", present & same).when(op == "!=", present & ~same).otherwise(F.lit(False))
    return F.coalesce(F.when(kind == "num", numeric).otherwise(other), F.lit(False))


def compare(x: Column | FieldValue, operator: str, value: object) -> Column:
    """`x <operator> value` for an event value `x` (VARIANT, NULL = missing, or its
    pre-extracted FieldValue); never NULL."""
    spec = value_spec(value)
    return compare_spec(
        x if isinstance(x, FieldValue) else field_value(x),
        F.lit(operator),
        F.lit(spec["kind"]),
        F.lit(spec["num"]).cast("double"),
        F.lit(spec["str"]).cast("string"),
        F.lit(spec["bool"]).cast("boolean"),
    )


def condition_column(v: Column, cond: Condition, values: dict[str, FieldValue] | None = None) -> Column:
    x = values[cond.field] if values and cond.field in values else field(v, cond.field)
    return compare(x, cond.operator, cond.value)


def all_conditions(v: Column, conditions: Iterable[Condition], values: dict[str, FieldValue] | None = None) -> Column:
    """AND of the conditions; an empty list is always true (an unfiltered velocity rule).

    `values` holds paths already extracted by `with_field_values`."""
    cols = [condition_column(v, c, values) for c in conditions]
    return reduce(lambda a, b: a & b, cols, F.lit(True))


def _py_number(x: object) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and _NUMERIC.match(x):
        return float(x)
    return None


def compare_json(json_value: str | None, operator: str, value: object) -> bool:
    """`compare` for one JSON value in Python, for the few decisions the live job makes
    outside the JVM (a `last` context value under metric `direct`). Same semantics."""
    if json_value is None:
        return False
    x = json.loads(json_value)
    if x is None:
        return False
    num = rule_value_number(value)
    if num is not None:
        a = _py_number(x)
        if operator == "!=":
            return a is None or a != num
        if a is None:
            return False
        return {"==": a == num, ">": a > num, "<": a < num, ">=": a >= num, "<=": a <= num}[operator]
    if operator not in ("==", "!="):
        return False
    same = (isinstance(x, bool) and x is value) if isinstance(value, bool) else (isinstance(x, str) and x == str(value))
    return same if operator == "==" else not same
