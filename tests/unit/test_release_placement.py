"""Where a release's Spark work runs (the platform's warm Spark Connect server when
`rulectl up` runs one) and the plan's split into backtests and a quality check that
run side by side."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from spark_jobs.lifecycle import release
from spark_jobs.lifecycle.settings import LifecycleSettings, platform_connect_url


def _state(tmp_path: Path, port: int, running: bool = True) -> dict[str, str]:
    state = tmp_path / "platform.json"
    state.write_text(json.dumps({"components": {"connect": {
        "pid": 1, "argv": ["python", "-m", "spark_jobs.cli", "connect", "--port", str(port)], "running": running}}}))
    return {"RULES_PLATFORM_STATE": str(state)}


def test_auto_finds_the_platforms_connect_server_only_while_it_answers(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        env = _state(tmp_path, port)
        assert platform_connect_url(env) == f"sc://127.0.0.1:{port}"
        assert LifecycleSettings(state_dir=str(tmp_path)).remote_url(env) == f"sc://127.0.0.1:{port}"
        assert LifecycleSettings(state_dir=str(tmp_path), spark_remote="local").remote_url(env) is None
        assert platform_connect_url(_state(tmp_path, port, running=False)) is None
    assert platform_connect_url(env) is None  # marked running, but nothing listens
    assert platform_connect_url({}) is None  # no platform here
    fixed = LifecycleSettings(state_dir=str(tmp_path), spark_remote="sc://spark.example:15002")
    assert fixed.remote_url({}) == "sc://spark.example:15002"


def test_spark_remote_is_checked() -> None:
    with pytest.raises(ValueError, match="spark_remote"):
        LifecycleSettings(spark_remote="http://elsewhere")


def test_a_remote_backtest_is_told_where_to_run() -> None:
    spec = {"rules_dir": "/r", "out_dir": "/o", "only": ["a"], "remote": "sc://127.0.0.1:15002"}
    args = release.backtest_args(spec, {"events.raw": "/e.jsonl"}, "timestamp", "events.processed")
    assert args[args.index("--remote") + 1] == "sc://127.0.0.1:15002"
    assert "--remote" not in release.backtest_args({**spec, "remote": None}, {"events.raw": "/e"}, "t", "s")


def test_the_archive_plan_needs_no_spark_and_takes_its_counts_from_the_check(tmp_path: Path) -> None:
    table = tmp_path / "events"
    (table / "_delta_log").mkdir(parents=True)
    settings = LifecycleSettings(state_dir=str(tmp_path / "state"), archive_table=str(table), archive_lookback_hours=1)
    rules = {"rapid_clicks": {"rule_id": "rapid_clicks", "version": "1", "rule_type": "velocity", "name": "x",
                              "source_topic": "events.raw", "group_by": "user_id", "window_size": 10,
                              "window_unit": "seconds", "aggregation_type": "count", "threshold": 10}}
    plan = release.plan_history(settings, rules, work=tmp_path / "work")
    assert plan["inputs"][release.ARCHIVE_INPUT]["table"] == str(table)
    assert plan["slices"]["events.raw"]["records"] is None
    quality = {"success": True, "topics": {"events.raw": {"records": 42}}}
    done = release.with_quality(plan, quality)
    assert done["slices"]["events.raw"]["records"] == 42 and done["quality"] == quality
