"""What a person may pass when triggering a lifecycle DAG: an allow-list, not free-form.

Trigger params reach `spark-submit`, git and the file system, so anything not listed
here is refused: a `spark_conf` entry such as `spark.pyspark.python` or
`spark.driver.extraJavaOptions` would run any command on a worker, and a free path
would let a run read any file the worker can. Each model's JSON Schema is given to the
DAG's `Param`s, so Airflow itself refuses a bad trigger (REST API 400, UI form error)
before a run exists and before any task runs; the tasks validate again with the same
models (defence in depth: `airflow dags test -c`, or an older serialized DAG).

History inputs are *relative* paths under the configured `history_root` (a setting an
operator sets in the Variable or environment, never a trigger param): the pattern
refuses absolute paths and `..` segments, and `resolve_history_inputs` refuses a path
that leaves the root through a symlink.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Kafka's topic name rule (legal characters, at most 249).
TopicName = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,249}$")]
# A relative path: segments of a conservative character set, none starting with '.'
# (so no '..', no '.', no hidden files) and no leading '/'.
HistoryPath = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9_=-][A-Za-z0-9_.=-]{0,254}(/[A-Za-z0-9_=-][A-Za-z0-9_.=-]{0,254}){0,15}$",
        description="Path relative to the configured history_root (no '..', not absolute)",
    ),
]
CommitId = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{7,40}$", description="A commit id (7-40 hex digits)")]
FieldPath = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")]


class ParamsRejected(ValueError):
    """A trigger param outside the allow-list; the message names the key and why."""


class RunSettings(BaseModel):
    """The lifecycle settings a run may override; everything else (repository, Spark
    master and conf, Kafka, state folders) is the operator's, set in the Variable."""

    model_config = ConfigDict(extra="forbid")

    history_inputs: dict[TopicName, HistoryPath] | None = Field(
        None, description="topic -> history file or folder, relative to history_root"
    )
    history_lookback_hours: float | None = Field(None, gt=0, le=24 * 31)
    history_window_end: Literal["latest", "interval"] | None = None
    history_slice: bool | None = None
    time_field: FieldPath | None = None
    report_max_rows: int | None = Field(None, ge=1, le=5000)


class ReleaseParams(BaseModel):
    """Params of `rule_release`."""

    model_config = ConfigDict(extra="forbid")

    commit: CommitId | None = Field(None, description="Release this commit (default: new head of the branch)")
    settings: RunSettings = Field(default_factory=RunSettings)


class ReportParams(BaseModel):
    """Params of `backtest_report`."""

    model_config = ConfigDict(extra="forbid")

    settings: RunSettings = Field(default_factory=RunSettings)


# The platform DAGs whose params are an allow-list, by dag_id. Airflow checks each
# declared Param against its schema but accepts any *undeclared* top-level key as a
# free-form param (SerializedParamsDict.deep_merge gives it an empty schema), so the
# api-server refuses those itself (plugins/rule_lifecycle/trigger_params.py) with this
# map, and the tasks check again with the same models.
ALLOW_LISTS: dict[str, type[BaseModel]] = {"rule_release": ReleaseParams, "backtest_report": ReportParams}


def _inline_refs(schema: dict) -> dict:
    """The model's JSON Schema with `$defs` inlined: each Param holds only its own
    property's schema, so a `$ref` into the model's `$defs` would dangle."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return walk(defs[node["$ref"].rsplit("/", 1)[-1]])
            out = {k: walk(v) for k, v in node.items() if k != "$defs"}
            if "patternProperties" in out:  # a key that matches no pattern is refused too
                out.setdefault("additionalProperties", False)
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(schema)


def param_schema(model: type[BaseModel], name: str) -> dict:
    """JSON Schema of one field of `model`, for `airflow.sdk.Param(**schema)`."""
    props = _inline_refs(model.model_json_schema())["properties"][name]
    props.pop("title", None)
    props.pop("default", None)
    return props


def validate_params(model: type[BaseModel], params: Mapping[str, Any]) -> BaseModel:
    """`model` from a run's params; ParamsRejected with every offending key."""
    try:
        return model.model_validate(dict(params))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ParamsRejected(f"refused trigger params: {problems}") from None


def overrides(model: BaseModel) -> dict[str, Any]:
    """The settings overrides a validated params model carries (unset keys dropped)."""
    settings = getattr(model, "settings", None)
    return settings.model_dump(exclude_none=True) if settings is not None else {}


def resolve_history_inputs(history_root: str | Path, inputs: Mapping[str, str]) -> dict[str, str]:
    """Absolute paths of run-given history inputs, each inside `history_root`.

    Resolves symlinks, so a link inside the root cannot lead outside it."""
    root = Path(history_root).resolve()
    out = {}
    for topic, rel in inputs.items():
        if Path(rel).is_absolute():
            raise ParamsRejected(f"history_inputs.{topic}: absolute paths are refused; give a path under history_root")
        target = (root / rel).resolve()
        if target != root and root not in target.parents:
            raise ParamsRejected(f"history_inputs.{topic}: {rel!r} leaves the history root")
        out[topic] = str(target)
    return out
