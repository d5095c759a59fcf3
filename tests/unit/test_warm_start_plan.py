"""Which keyed rules the live job warms from the archive, and how (streaming/warmup.py):
the plan kept in the checkpoint, without Spark or a broker."""

from __future__ import annotations

import base64
import hashlib
import json

from spark_jobs.engine.rule_set import WarmState, keyed_spec
from spark_jobs.rules.model import parse_rule, rule_to_json_dict
from spark_jobs.streaming.rules_source import rule_rows
from spark_jobs.streaming.warmup import WarmWindows, state_digest


def _velocity(**extra: object) -> dict:
    return {"rule_id": "v", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
            "group_by": "card", "window_size": 1, "window_unit": "hours", "aggregation_type": "count",
            "threshold": 5, **extra}


def _rows(*rules: dict) -> list:
    return [row for d in rules for row in rule_rows(parse_rule(d), "routed")]


def _windows(tmp_path, *, ran: bool = True) -> WarmWindows:  # noqa: ANN001
    """The warm-ups of a checkpoint whose query ran (`ran`: a batch is planned and the
    warm-ups are kept), or of a new one."""
    if ran:
        (tmp_path / "query" / "offsets").mkdir(parents=True, exist_ok=True)
        (tmp_path / "query" / "offsets" / "0").write_text("v1\n{}\n{}\n")
        if not (tmp_path / "rules" / "warm.json").exists():
            (tmp_path / "rules").mkdir(exist_ok=True)
            (tmp_path / "rules" / "warm.json").write_text("{}")
    return WarmWindows(None, checkpoint=tmp_path, versions_dir=tmp_path / "versions", bootstrap="unused:1",  # type: ignore[arg-type]
                       topic="detect.warmup", archive=None, role="detector", max_ahead_ms=1000)


def test_a_new_keyed_rule_loads_and_a_threshold_rule_is_not_planned(tmp_path):
    threshold = {"rule_id": "t", "version": "1", "rule_type": "threshold", "source_topic": "events.raw",
                 "conditions": [{"field": "x", "operator": ">", "value": 1}]}
    plan = _windows(tmp_path).plan(_rows(_velocity(), threshold))
    assert plan == {"v": WarmState(epoch=0, warming=True)}


def test_warm_start_false_and_fed_correlations_start_cold(tmp_path):
    fed = {"rule_id": "c", "version": "1", "rule_type": "correlation", "source_topic": "events.raw",
           "context_topic": "context.raw", "correlation_key": "card", "window_size": 1, "window_unit": "hours",
           "context_resolution": "last", "context_value_field": "x", "timestamp_field": "ts",
           "condition": {"operator": ">", "value": 1}, "velocity_filter_rule_id": "v"}
    w = _windows(tmp_path)
    plan = w.plan(_rows(_velocity(warm_start=False, emit_to_sink=False), fed))
    assert plan == {"v": WarmState(0, False), "c": WarmState(0, False)}
    status = w.status()
    assert status["v"]["state"] == status["c"]["state"] == "cold"
    assert status["v"]["reason"] == "warm_start: false"


def test_an_unchanged_rule_keeps_its_state_and_a_new_window_or_signature_starts_afresh(tmp_path):
    w = _windows(tmp_path)
    w.plan(_rows(_velocity()))
    w.entries["v"].state = "warm"  # its warm-up came in
    # A new threshold keeps the window: nothing to warm.
    assert w.plan(_rows(_velocity(version="2", threshold=9))) == {"v": WarmState(0, False)}
    # A new window keeps the signature: a new epoch drops the state the old window kept.
    assert w.plan(_rows(_velocity(version="3", window_size=2))) == {"v": WarmState(1, True)}
    w.entries["v"].state = "warm"
    # New conditions: a new signature starts afresh by itself.
    changed = _velocity(version="4", window_size=2, conditions=[{"field": "kind", "operator": "==", "value": "pay"}])
    assert w.plan(_rows(changed)) == {"v": WarmState(0, True)}
    # A rule that goes is forgotten.
    assert w.plan([]) == {}


def test_a_warm_up_cut_short_by_a_stop_starts_again_under_a_new_epoch(tmp_path):
    w = _windows(tmp_path)
    w.plan(_rows(_velocity()))
    w.published("hash-1")
    assert json.loads((tmp_path / "rules" / "warm.json").read_text())["v"]["hashes"] == ["hash-1"]
    again = _windows(tmp_path)
    assert again.plan(_rows(_velocity())) == {"v": WarmState(1, True)}
    assert again.entries["v"].hashes == []


def test_the_spec_marks_a_loading_rule_and_folds_the_epoch_into_its_signature():
    rows = _rows(_velocity())
    plain = keyed_spec(rows)[0]["rule"]
    spec = keyed_spec(rows, {"v": WarmState(2, True)})[0]["rule"]
    assert spec["warming"] is True and "warming" not in plain
    assert json.loads(spec["signature"]) == {**json.loads(plain["signature"]), "warm_epoch": 2}


def test_a_new_query_reading_from_the_start_and_an_older_checkpoint_warm_nothing(tmp_path):
    new = _windows(tmp_path / "new", ran=False)
    assert new.plan(_rows(_velocity())) == {"v": WarmState(0, False)}
    assert new.status()["v"]["reason"] == "a new query: it reads its topics from the start"
    # Only the first plan: a rule published later loads.
    assert new.plan(_rows(_velocity(), _velocity(rule_id="w"))) == {"v": WarmState(0, False), "w": WarmState(0, True)}
    older = tmp_path / "older"
    (older / "query" / "offsets").mkdir(parents=True)
    (older / "query" / "offsets" / "7").write_text("v1\n{}\n{}\n")
    assert _windows(older, ran=False).plan(_rows(_velocity())) == {"v": WarmState(0, False)}


def test_state_digest_is_the_first_16_bytes_of_sha256_in_base64url():
    sig = '{"group_by":"card"}'
    sha = hashlib.sha256(sig.encode("utf-8")).digest()
    assert state_digest(sig) == base64.urlsafe_b64encode(sha[:16]).decode().rstrip("=")
    assert len(state_digest(sig)) == 22


def test_warm_start_true_is_left_out_of_the_canonical_form():
    assert "warm_start" not in rule_to_json_dict(parse_rule(_velocity()))
    assert rule_to_json_dict(parse_rule(_velocity(warm_start=False)))["warm_start"] is False


def test_a_velocity_shadow_letting_in_what_the_version_in_force_does_shares_its_window(tmp_path):
    w = _windows(tmp_path)
    in_force, shadow = _velocity(), _velocity(version="2", mode="shadow", threshold=3)
    plan = w.plan(_rows(in_force, shadow))
    assert plan == {"v": WarmState(0, True), "v@shadow": WarmState(0, False)}
    # It judges with the version in force: loading while that loads.
    assert w.status()["v@shadow"]["state"] == "loading"
    w.entries["v"].state = "warm"
    assert w.status()["v@shadow"]["state"] == "shared"
    # Another window: a window of its own, filled from the archive.
    assert w.plan(_rows(in_force, _velocity(version="3", mode="shadow", window_size=2)))["v@shadow"] == WarmState(1, True)
    # Other conditions: its own too, under its own signature.
    w.entries["v@shadow"].state = "warm"
    other = _velocity(version="4", mode="shadow", conditions=[{"field": "kind", "operator": "==", "value": "x"}])
    assert w.plan(_rows(in_force, other))["v@shadow"] == WarmState(0, True)


def test_a_sharing_shadow_takes_the_epoch_of_the_version_in_force(tmp_path):
    w = _windows(tmp_path)
    w.plan(_rows(_velocity()))
    w.entries["v"].state = "warm"
    w.plan(_rows(_velocity(version="2", window_size=3)))  # a new window: epoch 1
    plan = w.plan(_rows(_velocity(version="2", window_size=3), _velocity(version="5", mode="shadow", window_size=3)))
    assert plan["v@shadow"] == WarmState(1, False) and plan["v"].epoch == 1


def _correlation(**extra: object) -> dict:
    return {"rule_id": "c", "version": "1", "rule_type": "correlation", "source_topic": "events.raw",
            "context_topic": "context.raw", "correlation_key": "card", "window_size": 1, "window_unit": "hours",
            "context_resolution": "last", "context_value_field": "x", "timestamp_field": "ts",
            "condition": {"operator": ">", "value": 1}, **extra}


def test_a_correlation_shadow_with_the_same_context_and_lookback_shares_the_context(tmp_path):
    w = _windows(tmp_path)
    plan = w.plan(_rows(_correlation(), _correlation(version="2", mode="shadow", metric="direct",
                                                     context_resolution="mean", condition={"operator": "<", "value": 3})))
    # Another resolution and condition judge the same context: nothing of its own to fill.
    assert plan == {"c": WarmState(0, True), "c@shadow": WarmState(0, False)}
    w.entries["c"].state = "warm"
    assert w.status()["c@shadow"]["state"] == "shared"
    assert w.status()["c@shadow"]["reason"] == "shares the state of the version in force"
    # A narrower lookback keeps less context: its own, filled from the archive.
    narrower = _correlation(version="3", mode="shadow", max_context_age_seconds=600)
    assert w.plan(_rows(_correlation(), narrower))["c@shadow"] == WarmState(1, True)
    # Another context filter: other context enters, under its own signature.
    w.entries["c@shadow"].state = "warm"
    other = _correlation(version="4", mode="shadow", context_type_field="kind", context_type_value="limit")
    assert w.plan(_rows(_correlation(), other))["c@shadow"] == WarmState(0, True)
