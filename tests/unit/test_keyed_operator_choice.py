"""Which keyed operator a checkpoint runs (job.keyed_operator): the JVM and the Python
operator keep their state in different layouts, so the choice is made once per
checkpoint and a later setting cannot switch a checkpoint to the other."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.streaming.job import DEFAULT_KEYED_OPERATOR, KEYED_OPERATOR_ENV, DetectConfig, keyed_operator


def test_a_new_checkpoint_takes_the_setting_and_keeps_it(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(KEYED_OPERATOR_ENV, raising=False)
    assert keyed_operator(DetectConfig(checkpoint=tmp_path / "a", keyed_operator="jvm")) == "jvm"
    assert keyed_operator(DetectConfig(checkpoint=tmp_path / "a", keyed_operator="python")) == "jvm"
    assert (tmp_path / "a" / "keyed_operator").read_text() == "jvm"


def test_the_environment_then_the_default(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(KEYED_OPERATOR_ENV, "python")
    assert keyed_operator(DetectConfig(checkpoint=tmp_path / "a")) == "python"
    monkeypatch.delenv(KEYED_OPERATOR_ENV)
    assert keyed_operator(DetectConfig(checkpoint=tmp_path / "b")) == DEFAULT_KEYED_OPERATOR


def test_a_checkpoint_from_before_the_choice_stays_python(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(KEYED_OPERATOR_ENV, raising=False)
    (tmp_path / "query").mkdir()
    assert keyed_operator(DetectConfig(checkpoint=tmp_path, keyed_operator="jvm")) == "python"


def test_an_unknown_operator_is_refused(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(KEYED_OPERATOR_ENV, "scala")
    with pytest.raises(ValueError, match="keyed operator"):
        keyed_operator(DetectConfig(checkpoint=tmp_path))
