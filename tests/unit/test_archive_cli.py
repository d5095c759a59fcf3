"""The archive's command-line surface without Spark: time windows, argument checks, and
how a plan's archive window becomes backtest arguments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spark_jobs.archive.table import parse_time
from spark_jobs.cli import build_parser, main
from spark_jobs.commands import backtest as backtest_cmd
from spark_jobs.lifecycle.release import ARCHIVE_INPUT, backtest_args, use_archive
from spark_jobs.lifecycle.settings import LifecycleSettings

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("text,want", [
    ("-1h", NOW - timedelta(hours=1)), ("-30m", NOW - timedelta(minutes=30)), ("-2d", NOW - timedelta(days=2)),
    ("- 90s", NOW - timedelta(seconds=90)), ("-1w", NOW - timedelta(weeks=1)), ("now", NOW),
    ("2026-11-23T10:00:00Z", datetime(2026, 11, 23, 10, tzinfo=UTC)),
    ("2026-11-23T10:00:00", datetime(2026, 11, 23, 10, tzinfo=UTC)),  # no offset: UTC
    ("2026-11-23T11:00:00+01:00", datetime(2026, 11, 23, 10, tzinfo=UTC)),
])
def test_window_times_are_iso_or_relative(text, want):
    assert parse_time(text, NOW) == want


@pytest.mark.parametrize("text", ["1h", "-1y", "yesterday", ""])
def test_bad_window_times_are_refused(text):
    with pytest.raises(ValueError):
        parse_time(text, NOW)


def _run(argv: list[str]) -> int:
    return main(argv)


def test_backtest_takes_files_or_the_archive_not_both(tmp_path: Path, capsys):
    table = tmp_path / "t"
    (table / "_delta_log").mkdir(parents=True)
    base = ["backtest", "--rules", "rules", "--out", str(tmp_path / "o")]
    assert _run(base) == 2
    assert _run([*base, "--input", f"events.raw={tmp_path}", "--history", str(table)]) == 2
    assert _run([*base, "--history", str(tmp_path / "nope")]) == 2
    assert "not a Delta table" in capsys.readouterr().err
    assert _run([*base, "--history", str(table), "--from", "-1h", "--to", "-2h"]) == 2
    assert "must be before" in capsys.readouterr().err
    args = build_parser().parse_args(backtest_cmd.join_relative_times([*base, "--history", str(table), "--from", "-3h"]))
    assert backtest_cmd._history(args).table == str(table.resolve())


def test_a_plans_archive_window_becomes_history_arguments():
    spec = {"rules_dir": "r", "out_dir": "o", "only": ["a"]}
    inputs = {ARCHIVE_INPUT: {"table": "/t", "from": "2026-11-23T10:00:00.000Z", "to": "2026-11-23T11:00:00.000Z"}}
    args = backtest_args(spec, inputs, "timestamp", "events.processed")
    assert args[args.index("--history"):args.index("--history") + 6] == [
        "--history", "/t", "--from", "2026-11-23T10:00:00.000Z", "--to", "2026-11-23T11:00:00.000Z"]
    assert "--input" not in args
    assert "--input" in backtest_args(spec, {"events.raw": "/e.jsonl"}, "timestamp", "events.processed")


def test_history_source_auto_uses_the_archive_only_when_the_table_exists(tmp_path: Path):
    table = tmp_path / "events"
    s = LifecycleSettings(state_dir=str(tmp_path), archive_table=str(table))
    assert not use_archive(s)
    (table / "_delta_log").mkdir(parents=True)
    assert use_archive(s)
    assert not use_archive(LifecycleSettings(state_dir=str(tmp_path), archive_table=str(table), history_source="files"))
    with pytest.raises(FileNotFoundError):
        use_archive(LifecycleSettings(state_dir=str(tmp_path), archive_table=str(tmp_path / "x"),
                                      history_source="archive"))
    with pytest.raises(ValueError, match="history_source"):
        LifecycleSettings(state_dir=str(tmp_path), history_source="lake")
