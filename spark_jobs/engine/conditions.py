"""Conditions (`{field, operator, value}`) compiled to Spark Column expressions.

Semantics (docs/rule-language.md, "Values, paths and comparisons"): a missing field
(or JSON null) never matches;
a number and a numeric string compare as numbers for every operator; ordering
operators on non-numeric values never match; otherwise `==`/`!=` compare JSON values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from functools import reduce
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_jobs.engine.values import NUMERIC_RE, FieldValue, field, field_value
from spark_jobs.rules.model import Condition

_NUMERIC = re.compile(NUMERIC_RE)


def _py_number(x: object) -> float | None:
    """A JSON number or numeric string as float (booleans are not numbers)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and _NUMERIC.match(x):
        return float(x)
    return None


def rule_value_number(value: object) -> float | None:
    """The number a rule value stands for, if it is a number or a numeric string; a
    string that overflows to infinity ("1e999") stays a string."""
    num = _py_number(value)
    if isinstance(value, str) and num is not None and not math.isfinite(num):
        return None
    return num


def value_spec(value: object) -> dict[str, object]:
    """A rule value as data: its kind (`num`, `str`, `bool`) and its typed forms.

    The live job's compiled rule rows carry conditions in this shape (rules_source.Cond),
    and `compare_spec` takes it.
    """
    num = rule_value_number(value)
    if num is not None:
        return {"kind": "num", "num": num, "str": None, "bool": None}
    if isinstance(value, bool):
        return {"kind": "bool", "num": None, "str": None, "bool": value}
    return {"kind": "str", "num": None, "str": str(value), "bool": None}


def _case(selector: object, branches: dict[Any, Callable[[], Column]], default: Callable[[], Column]) -> Column:
    """The branch for a rule's operator or value kind, picked here in Python, so only
    that branch is built: a rule set's plan stays small and quick to optimize."""
    return branches.get(selector, default)()


def compare_spec(x: FieldValue, op: str, kind: str, num: float | None, text: str | None, flag: bool | None) -> Column:
    """`x <op> value`, the value given as its spec (value_spec); never NULL. The
    backtest and the live job both compile their rules with it, so a rule means the
    same in both.

    Built once per (value, comparison): rules repeat conditions (the benchmark's 50
    threshold rules test `type` against 4 values), and every Column built is Py4J round
    trips of planning."""
    key = (op, kind, num, text, flag)
    built = x.compared.get(key)
    if built is None:
        built = x.compared[key] = _compare(x, op, kind, num, text, flag)
    return built


def _compare(x: FieldValue, op: str, kind: str, num: float | None, text: str | None, flag: bool | None) -> Column:
    a = x.num
    present = x.present

    def never() -> Column:
        return F.lit(False)

    def numeric() -> Column:
        # A missing or non-numeric value compares as NULL: the final coalesce makes it false.
        number = F.lit(float(num))
        return _case(op, {
            "==": lambda: a == number,
            # A present value that is not a number is "not equal" to a number.
            "!=": lambda: present & (a.isNull() | (a != number)),
            ">": lambda: a > number,
            "<": lambda: a < number,
            ">=": lambda: a >= number,
            "<=": lambda: a <= number,
        }, never)

    def same() -> Column:
        def as_bool() -> Column:
            return x.json == _case(flag, {True: lambda: F.lit("true")}, lambda: F.lit("false"))

        return F.coalesce(_case(kind, {"bool": as_bool}, lambda: x.str == F.lit(text).cast("string")), F.lit(False))

    def other() -> Column:
        return _case(op, {"==": lambda: present & same(), "!=": lambda: present & ~same()}, never)

    return F.coalesce(_case(kind, {"num": numeric}, other), F.lit(False))


def compare(x: Column | FieldValue, operator: str, value: object) -> Column:
    """`x <operator> value` for an event value `x` (VARIANT, NULL = missing, or its
    pre-extracted FieldValue); never NULL."""
    spec = value_spec(value)
    return compare_spec(
        x if isinstance(x, FieldValue) else field_value(x),
        operator, spec["kind"], spec["num"], spec["str"], spec["bool"],
    )


def condition_column(v: Column, cond: Condition, values: dict[str, FieldValue] | None = None) -> Column:
    x = values[cond.field] if values and cond.field in values else field(v, cond.field)
    return compare(x, cond.operator, cond.value)


def all_conditions(v: Column, conditions: Iterable[Condition], values: dict[str, FieldValue] | None = None) -> Column:
    """AND of the conditions; an empty list is always true (an unfiltered velocity rule).

    `values` holds paths already extracted (values.extract_fields)."""
    cols = [condition_column(v, c, values) for c in conditions]
    return reduce(lambda a, b: a & b, cols, F.lit(True))
