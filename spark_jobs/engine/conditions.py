"""A condition's rule value (`{field, operator, value}`) as data for the rule-set
evaluator (`ruleplatform.rules.Condition`), which compares it with event values.

Semantics (docs/rule-language.md, "Values, paths and comparisons"): a missing field
(or JSON null) never matches;
a number and a numeric string compare as numbers for every operator; ordering
operators on non-numeric values never match; otherwise `==`/`!=` compare JSON values.
"""

from __future__ import annotations

import math
import re

from spark_jobs.engine.values import NUMERIC_RE

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

    The rule rows carry conditions in this shape (rules_source.Cond), and the
    evaluator's spec is made of them (rule_set.py).
    """
    num = rule_value_number(value)
    if num is not None:
        return {"kind": "num", "num": num, "str": None, "bool": None}
    if isinstance(value, bool):
        return {"kind": "bool", "num": None, "str": None, "bool": value}
    return {"kind": "str", "num": None, "str": str(value), "bool": None}
