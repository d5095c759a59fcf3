"""Warm windows (issue 39): a velocity rule published into a running job starts with its
windows filled from the event archive and Kafka, and judges its first events as the
backtest over the archive does; the same rule started cold does not. Real broker over
TCP, the real job in its own process, a real Delta archive, the real backtest."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from archive_harness import write_records
from detect_harness import DetectJob, detections, produce, wait_detections

from spark_jobs.backtest.runner import BacktestConfig, HistoryWindow, run_backtest
from spark_jobs.kafka.admin import read_all
from spark_jobs.kafka.broker import EmbeddedBroker, free_port
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.model import parse_rule

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

TOPIC = "events.raw"
CONTEXT = "context.raw"


def _iso(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _pay(card: str, n: int, at: datetime) -> str:
    return json.dumps({"type": "wpay", "card": card, "n": n, "timestamp": _iso(at)})


def _rule(rule_id: str, kind: str = "wpay", **extra: object) -> dict:
    """Five payments of one card within an hour (event time), at every event."""
    return {"rule_id": rule_id, "version": "1", "rule_type": "velocity", "source_topic": TOPIC,
            "conditions": [{"field": "type", "operator": "==", "value": kind}], "group_by": "card",
            "window_size": 1, "window_unit": "hours", "aggregation_type": "count", "threshold": 5,
            "emit_mode": "all_events", "time_mode": "event_time", "timestamp_field": "timestamp",
            "watermark_delay": 60, **extra}


def _limit_rule(rule_id: str, **extra: object) -> dict:
    """A purchase above the account's latest limit (context) of the hour before it."""
    return {"rule_id": rule_id, "version": "1", "rule_type": "correlation", "source_topic": TOPIC,
            "context_topic": CONTEXT, "correlation_key": "acct", "window_size": 1, "window_unit": "hours",
            "context_resolution": "last", "context_value_field": "limit", "timestamp_field": "timestamp",
            "metric": "difference", "event_value_field": "amount", "condition": {"operator": ">", "value": 0},
            "watermark_delay": 60, **extra}


def test_a_warm_started_hour_window_detects_its_first_events_as_the_backtest_over_the_archive(tmp_path, spark):
    now = datetime.now(tz=UTC)
    table = tmp_path / "archive" / "events"
    with EmbeddedBroker(port=free_port()) as broker:
        # The job runs with an event-time rule on the topic (so no restart is asked for
        # when the payment rules come) and has read an hour's payments before they come.
        publish_rules([parse_rule(_rule("filler", kind="nothing")), parse_rule(
            {"rule_id": "filler_ctx", "version": "1", "rule_type": "threshold", "source_topic": CONTEXT,
             "conditions": [{"field": "type", "operator": "==", "value": "nothing"}]})], broker.bootstrap)
        # An account's limit, set 20 minutes ago (only on the broker: not archived yet).
        limit = json.dumps({"acct": "a1", "limit": 100, "timestamp": _iso(now - timedelta(minutes=20))})
        produce(broker.bootstrap, CONTEXT, [limit])
        old = [_pay("c1", 1, now - timedelta(minutes=40)), _pay("c2", 1, now - timedelta(minutes=35)),
               _pay("c1", 2, now - timedelta(minutes=30)), _pay("c2", 2, now - timedelta(minutes=25)),
               _pay("c1", 3, now - timedelta(minutes=20)), _pay("c1", 4, now - timedelta(minutes=10))]
        produce(broker.bootstrap, TOPIC, old)
        records = read_all(broker.bootstrap, TOPIC)
        assert [r.value.decode() for r in records] == old

        def archive(recs) -> None:  # noqa: ANN001 - KafkaRecords, as `rulectl archive` writes them
            write_records(spark, table, [(r.topic, r.offset, datetime.fromtimestamp(r.timestamp_ms / 1000, tz=UTC),
                                          r.value) for r in recs])

        # The archive has the first four; the last two are still only on the broker (the
        # archive job lags): the warm-up reads the archive, then Kafka past its end.
        archive(records[:4])
        job = DetectJob(broker.bootstrap, tmp_path / "detect", extra_args=("--archive", str(table)))
        first = job.start()
        job.wait_for(lambda s: s.get("lag") == 0 and (s.get("num_input_rows") or 0) >= 0)

        fresh = [_rule("warm_pay"), _rule("cold_pay", warm_start=False), _limit_rule("warm_limit"),
                 _limit_rule("cold_limit", warm_start=False)]
        publish_rules([parse_rule(r) for r in fresh], broker.bootstrap)
        status = job.wait_for(lambda s: all(s.get("warm_windows", {}).get(r, {}).get("state") in ("warm", "warming")
                                            for r in ("warm_pay", "warm_limit")), timeout=180)
        warm = status["warm_windows"]
        assert warm["warm_pay"]["events"] == len(old) and warm["warm_limit"]["events"] == 1
        # The topics' first records are in the archive or still on the broker: whole windows.
        assert warm["warm_pay"]["state"] == warm["warm_limit"]["state"] == "warm"
        assert warm["cold_pay"]["state"] == "cold" and warm["cold_pay"]["reason"] == "warm_start: false"
        assert not [d for d in detections(broker.bootstrap) if d.get("type") == "wpay"]

        new = [_pay("c1", 5, now), _pay("c2", 3, now + timedelta(seconds=1)),
               _pay("c2", 4, now + timedelta(seconds=2)), _pay("c2", 5, now + timedelta(seconds=3)),
               json.dumps({"type": "wbuy", "acct": "a1", "amount": 150, "timestamp": _iso(now + timedelta(seconds=4))})]
        produce(broker.bootstrap, TOPIC, new)
        wait_detections(broker.bootstrap, "events.processed",
                        lambda d: len([x for x in d if x["rule_id"] in ("warm_pay", "warm_limit")]) >= 3)
        job.wait_for(lambda s: s.get("lag") == 0)
        sink = [d for d in detections(broker.bootstrap) if d.get("type") in ("wpay", "wbuy")]
        # By hand: c1 has four payments in the hour before its fifth (count 5 at n=5); c2
        # two before its three new ones (count 5 at the third, n=5); a1's purchase is 50
        # over the limit set 20 minutes before. Started cold, the payment rule counts 1
        # for c1 and 3 for c2, and the limit rule has no context: nothing.
        assert sorted((d["rule_id"], d.get("card") or d["acct"], d.get("n")) for d in sink) == [
            ("warm_limit", "a1", None), ("warm_pay", "c1", 5), ("warm_pay", "c2", 5)]
        assert job.status()["query_id"] == first["query_id"]

        # The backtest over the archive (now holding every record) gives the warm rule's
        # detections, ids and all; for the cold rule it gives detections live did not make.
        archive(read_all(broker.bootstrap, TOPIC)[4:])
        archive(read_all(broker.bootstrap, CONTEXT))
        rules_dir = tmp_path / "rules"
        rules_dir.mkdir()
        for r in fresh:
            (rules_dir / f"{r['rule_id']}.json").write_text(json.dumps(r))
        out = tmp_path / "backtest"
        run_backtest(spark, BacktestConfig(rules_dir, [], out, history=HistoryWindow(
            str(table), now - timedelta(hours=2), now + timedelta(minutes=5))))
        expected = [json.loads(line) for line in (out / "detections.jsonl").read_text().splitlines()]
        by_rule = {r["rule_id"]: sorted(d["detection_id"] for d in expected if d["rule_id"] == r["rule_id"])
                   for r in fresh}
        for rid in ("warm_pay", "warm_limit"):
            assert sorted(d["detection_id"] for d in sink if d["rule_id"] == rid) == by_rule[rid]
        assert len(by_rule["cold_pay"]) == 2 and len(by_rule["cold_limit"]) == 1
        assert not [d for d in sink if d["rule_id"] in ("cold_pay", "cold_limit")]
        assert job.stop() == 0
