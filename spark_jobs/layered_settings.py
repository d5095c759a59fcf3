"""Settings dataclasses resolved in layers: defaults < environment < Airflow Variable <
overrides (a DAG run's conf or params).

The lifecycle DAGs (`rule_lifecycle`) and the detection supervisor
(`detection_supervisor`) resolve their settings the same way; one implementation keeps
the two from drifting (how an environment value is read, which errors are raised).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")

_TRUE = ("1", "true", "yes", "on")
_NONE = ("", "none", "null")


def coerce(cls: type, name: str, text: str) -> object:
    """An environment value (text) as the type of field `name` of `cls`: JSON objects
    or `K=V,K=V` lists for dicts, yes/no words for bools, numbers, and `none`/`null`/
    empty for an optional int."""
    kind = str(next(f for f in fields(cls) if f.name == name).type)
    text = text.strip()
    if kind.startswith("dict"):
        if text.startswith("{"):
            return json.loads(text)
        return dict(part.split("=", 1) for part in text.split(",") if part.strip())
    if kind == "bool":
        return text.lower() in _TRUE
    if kind == "float":
        return float(text)
    if kind.startswith("int"):
        return None if "None" in kind and text.lower() in _NONE else int(text)
    return text


def from_dict(cls: type[T], data: Mapping, what: str) -> T:
    """`cls(**data)`, refusing names `cls` does not have: a misspelt setting is an
    error, not a silently ignored key."""
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"unknown {what} setting(s): {', '.join(unknown)}")
    return cls(**dict(data))


def env_settings(cls: type, prefix: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The fields of `cls` set as environment variables `<prefix><FIELD NAME>`."""
    env = os.environ if environ is None else environ
    return {f.name: coerce(cls, f.name, env[prefix + f.name.upper()])
            for f in fields(cls) if prefix + f.name.upper() in env}


def airflow_variable(name: str) -> dict[str, Any]:
    """The Airflow Variable `name` (a JSON object), or {} outside Airflow or when unset.

    Errors propagate: silently falling back to the defaults would, say, release from
    the wrong repository or signal the wrong job."""
    try:
        from airflow.sdk import Variable
    except ImportError:  # pragma: no cover - Airflow not installed
        return {}
    value = Variable.get(name, default=None, deserialize_json=True)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"Airflow Variable {name!r} must be a JSON object")
    return value


def resolve(cls: type[T], variable: str, prefix: str, overrides: Mapping | None = None,
            use_airflow: bool = True) -> T:
    """Defaults < environment < Airflow Variable `variable` < overrides (None values in
    overrides do not count)."""
    merged: dict[str, Any] = env_settings(cls, prefix)
    if use_airflow:
        merged.update(airflow_variable(variable))
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return from_dict(cls, merged, variable)
