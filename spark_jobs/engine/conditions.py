"""Conditions (`{field, operator, value}`) compiled to Spark Column expressions.

Semantics (DESIGN.md, "Fine points"): a missing field (or JSON null) never matches;
a number and a numeric string compare as numbers for every operator; ordering
operators on non-numeric values never match; otherwise `==`/`!=` compare JSON values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_jobs.engine.values import NUMERIC_RE, as_number, as_string, field, json_text
from spark_jobs.rules.model import Condition

_NUMERIC = re.compile(NUMERIC_RE)

_ORDERING = {">": Column.__gt__, "<": Column.__lt__, ">=": Column.__ge__, "<=": Column.__le__}


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


def compare(x: Column, operator: str, value: object) -> Column:
    """`x <operator> value` for an event value `x` (VARIANT, NULL = missing); never NULL."""
    num = rule_value_number(value)
    present = x.isNotNull()
    if num is not None:
        a = as_number(x)
        if operator == "==":
            result = a.isNotNull() & (a == F.lit(num))
        elif operator == "!=":
            # A present value that is not a number is "not equal" to a number.
            result = present & (a.isNull() | (a != F.lit(num)))
        else:
            result = a.isNotNull() & _ORDERING[operator](a, F.lit(num))
    else:
        if operator in _ORDERING:
            return F.lit(False)
        if isinstance(value, bool):
            same = json_text(x) == F.lit("true" if value else "false")
        else:
            same = as_string(x) == F.lit(str(value))
        same = F.coalesce(same, F.lit(False))
        result = present & same if operator == "==" else present & ~same
    return F.coalesce(result, F.lit(False))


def condition_column(v: Column, cond: Condition) -> Column:
    return compare(field(v, cond.field), cond.operator, cond.value)


def all_conditions(v: Column, conditions: Iterable[Condition]) -> Column:
    """AND of the conditions; an empty list is always true (an unfiltered velocity rule)."""
    cols = [condition_column(v, c) for c in conditions]
    return reduce(lambda a, b: a & b, cols, F.lit(True))
