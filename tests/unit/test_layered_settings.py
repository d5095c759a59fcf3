"""The layered settings shared by the lifecycle DAGs and the detection supervisor."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from spark_jobs import layered_settings


@dataclass
class Knobs:
    name: str = "a"
    flag: bool = False
    ratio: float = 1.0
    count: int = 3
    limit: int | None = None
    inputs: dict[str, str] = field(default_factory=dict)


def test_environment_values_take_the_field_types() -> None:
    env = {
        "K_NAME": " b ", "K_FLAG": "Yes", "K_RATIO": "2.5", "K_COUNT": "7", "K_LIMIT": "null",
        "K_INPUTS": "events.raw=/a.jsonl,context.raw=/b", "OTHER_NAME": "x",
    }
    assert layered_settings.env_settings(Knobs, "K_", env) == {
        "name": "b", "flag": True, "ratio": 2.5, "count": 7, "limit": None,
        "inputs": {"events.raw": "/a.jsonl", "context.raw": "/b"},
    }
    assert layered_settings.env_settings(Knobs, "K_", {"K_LIMIT": "500", "K_INPUTS": '{"t": "/p"}'}) == {
        "limit": 500, "inputs": {"t": "/p"},
    }
    # Only an optional int may be empty.
    with pytest.raises(ValueError):
        layered_settings.env_settings(Knobs, "K_", {"K_COUNT": "none"})


def test_layers_and_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("K_NAME", "from-env")
    monkeypatch.setenv("K_COUNT", "9")
    got = layered_settings.resolve(Knobs, "knobs", "K_", {"name": "override", "ratio": None}, use_airflow=False)
    assert got == Knobs(name="override", count=9)
    with pytest.raises(ValueError, match="unknown knobs setting"):
        layered_settings.resolve(Knobs, "knobs", "K_", {"nmae": "x"}, use_airflow=False)
