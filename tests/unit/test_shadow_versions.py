"""Shadow versions at unit level: the model's live id, the registry's keys, and the diff
(spark_jobs/lifecycle/shadow.py) on hand-made records. The acceptance test with the real
job and broker is tests/integration/test_detection_job.py::
test_a_shadow_version_runs_beside_the_version_in_force_and_never_reaches_the_sink."""

from __future__ import annotations

import json

from spark_jobs.kafka.admin import KafkaRecord
from spark_jobs.lifecycle.shadow import diff
from spark_jobs.rules.model import parse_rule, rule_to_json_dict
from spark_jobs.streaming.registry import apply_record

RULE = {"rule_id": "buy", "version": "1", "rule_type": "threshold", "source_topic": "events.raw",
        "conditions": [{"field": "amount", "operator": ">=", "value": 50}]}
SHADOW = {**RULE, "version": "2", "mode": "shadow"}
H = 3_600_000


def test_an_active_rule_keeps_its_canonical_form_and_a_shadow_has_its_own_key() -> None:
    assert "mode" not in rule_to_json_dict(parse_rule(RULE))
    assert rule_to_json_dict(parse_rule(SHADOW))["mode"] == "shadow"
    assert parse_rule(RULE).live_id == "buy" and parse_rule(SHADOW).live_id == "buy@shadow"


def test_the_registry_keeps_a_shadow_beside_the_version_in_force() -> None:
    rules: dict = {}
    assert apply_record(rules, "buy", json.dumps(RULE).encode(), 0) is None
    assert apply_record(rules, "buy@shadow", json.dumps(SHADOW).encode(), 1) is None
    assert {k: (r.version, r.mode) for k, r in rules.items()} == {"buy": ("1", "active"), "buy@shadow": ("2", "shadow")}
    # A shadow under the rule's own key would replace the version in force: refused.
    problem = apply_record(rules, "buy", json.dumps({**SHADOW, "version": "3"}).encode(), 2)
    assert problem is not None and "buy@shadow" in problem.reason
    assert apply_record(rules, "buy@shadow", None, 3) is None  # the tombstone ends it
    assert set(rules) == {"buy"}


def _det(topic: str, offset: int, ts: int, event: dict, version: str, shadow: bool = False) -> KafkaRecord:
    text = json.dumps(event)[:-1] + f',"rule_id":"buy","rule_version":"{version}","rule_type":"threshold",' \
        f'"processed":"x","detection_id":"{offset:032x}"' + (',"mode":"shadow"' if shadow else "") + "}"
    return KafkaRecord(topic, 0, offset, b"buy", text.encode(), ts, 0)


def test_the_diff_counts_each_event_once_in_the_hour_of_its_first_detection() -> None:
    published = 10 * H + 5
    rules_topic = [KafkaRecord("rules.active", 0, 0, b"buy", json.dumps(RULE).encode(), 0, 0),
                   KafkaRecord("rules.active", 0, 1, b"buy@shadow", json.dumps(SHADOW).encode(), published, 0)]
    ev = [{"id": i, "amount": a} for i, a in enumerate([60, 70, 80, 90])]
    sink = [_det("events.processed", 0, 9 * H, ev[0], "1"),  # before the shadow: not compared
            _det("events.processed", 1, 10 * H + 10, ev[1], "1"),
            _det("events.processed", 2, 11 * H + 1, ev[2], "1")]
    shadow = [_det("events.shadow", 0, 10 * H + 11, ev[1], "2", True),
              _det("events.shadow", 1, 11 * H - 1, ev[3], "2", True)]
    d = diff(sink, shadow, rules_topic, "buy")
    assert (d.shadow_version, d.current_version) == ("2", "1")
    assert d.totals == {"both": 1, "only_shadow": 1, "only_current": 1}
    assert [(h.hour, h.counts) for h in d.hours] == [
        ("1970-01-01T10:00Z", {"both": 1, "only_shadow": 1, "only_current": 0}),
        ("1970-01-01T11:00Z", {"both": 0, "only_shadow": 0, "only_current": 1})]
    assert d.hours[1].examples["only_current"] == [json.dumps(ev[2])]


def test_history_says_a_version_was_published_as_a_shadow(tmp_path, capsys) -> None:
    from spark_jobs.cli import main
    from spark_jobs.lifecycle import audit

    audit.append_record(tmp_path, {"event": "published", "commit": "a" * 40, "approved_by": {"name": "carol"},
                                   "rules": [{"rule_id": "buy", "version": "2", "mode": "shadow", "produced": True,
                                              "previous_version": "1"}]})
    audit.append_record(tmp_path, {"event": "published", "commit": "b" * 40, "approved_by": {"name": "dave"},
                                   "rules": [{"rule_id": "buy", "version": "2", "produced": True,
                                              "previous_version": "1"}]})
    assert main(["history", "buy", "--audit-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "published as a shadow by carol" in lines[0] and "aaaaaaaaaaaa" in lines[0]
    assert "published by dave" in lines[1] and "shadow" not in lines[1]
