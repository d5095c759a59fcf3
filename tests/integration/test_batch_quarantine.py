"""A micro-batch that fails anyway must not kill the job on the same input for ever.

Real broker, real job (`rulectl detect` in a subprocess). The failure is injected in the
JVM by a record holding a marker, from the test side: the job runs through
tests/faulty_detect.py, which wraps the plan's input so that such a record fails its
micro-batch (nothing in the poison corpus fails a batch any more, which is the point of
that corpus). What
the job does (quarantine.py): retry the batch once, then turn every record of its
offset ranges into a dead letter and go on.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from detect_harness import DetectJob, detections, produce, wait_detections

from spark_jobs.kafka.admin import read_all
from spark_jobs.kafka.broker import EmbeddedBroker, free_port
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.model import parse_rule

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

MARKER = "__injected_fault__"
FAULTY_DETECT = Path(__file__).resolve().parents[1] / "faulty_detect.py"
RULES = [
    {"rule_id": "big_purchase", "version": "1", "rule_type": "threshold", "source_topic": "events.q",
     "conditions": [{"field": "type", "operator": "==", "value": "purchase"},
                    {"field": "value", "operator": ">", "value": 100}]},
    {"rule_id": "click_burst", "version": "1", "rule_type": "velocity", "source_topic": "events.q",
     "group_by": "user", "window_size": 60, "window_unit": "seconds", "aggregation_type": "count", "threshold": 3,
     "time_mode": "event_time", "timestamp_field": "ts", "conditions": [{"field": "type", "operator": "==",
                                                                         "value": "click"}]},
]


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _purchases(tag: str, start_ms: int, n: int) -> list[str]:
    return [json.dumps({"type": "purchase", "order": f"{tag}{i}", "value": 500, "ts": _iso(start_ms + i)})
            for i in range(n)]


@pytest.fixture()
def job_with_fault(tmp_path, request):
    """The job, its input wrapped by faulty_detect.py; `request.param`: its extra options."""
    broker = EmbeddedBroker(port=free_port(), data_dir=tmp_path / "kafka").start()
    publish_rules([parse_rule(r) for r in RULES], broker.bootstrap)
    job = DetectJob(broker.bootstrap, tmp_path / "job", cli=(str(FAULTY_DETECT), MARKER), extra_args=getattr(request, "param", ()))
    yield broker, job
    if job.proc and job.proc.poll() is None:
        job.stop()
    broker.stop()


def _in_ranges(bs: str, ranges: list[dict]) -> list[str]:
    return [r.value.decode() for r in read_all(bs, "events.q")
            if any(q["partition"] == r.partition and q["start"] <= r.offset < q["end"] for q in ranges)]


def test_a_failing_batch_is_retried_then_quarantined_to_dead_letters_and_the_job_goes_on(job_with_fault):
    broker, job = job_with_fault
    bs = broker.bootstrap
    now = int(time.time() * 1000)
    produce(bs, "events.q", _purchases("before", now - 30_000, 3))
    job.start()
    job.wait_for(lambda s: s.get("lag") == 0, timeout=120)

    poison = json.dumps({"type": "purchase", "order": "poison", "value": 500, "note": MARKER, "ts": _iso(now - 20_000)})
    produce(bs, "events.q", [*_purchases("same", now - 20_000, 2), poison])
    # The job retries, quarantines, and carries on: never exits, state stays running.
    status = job.wait_for(lambda s: s.get("batch_failures", 0) >= 2 and s.get("quarantined"), timeout=240)
    failed_batch = status["quarantined"][0]["batch_id"]
    # The failed batch runs again, its records set aside, and commits.
    status = job.wait_for(lambda s: (s.get("last_batch_id") or -1) >= failed_batch and s.get("lag") == 0, timeout=120)
    assert job.proc.poll() is None
    assert status["state"] == "running"
    assert status["last_failure"]["action"] == "quarantined"
    assert "injected fault" in status["last_failure"]["error"]

    # Every record of the quarantined ranges is a dead letter with the reason, the
    # poison among them; none of them is lost and none was evaluated.
    quarantined = status["quarantined"]
    assert quarantined and all(r["topic"] == "events.q" for r in quarantined)
    in_ranges = _in_ranges(bs, quarantined)
    assert poison in in_ranges
    dead = [json.loads(r.value) for r in read_all(bs, "events.deadletter")]
    quarantined_dead = [d for d in dead if d["reason"].startswith("quarantined: micro-batch")]
    assert sorted(d["raw"] for d in quarantined_dead) == sorted(in_ranges)
    assert not [d for d in detections(bs) if d.get("order") == "poison"]

    # Events after the quarantine are detected as usual.
    produce(bs, "events.q", _purchases("after", now - 10_000, 2))
    dets = wait_detections(bs, "events.processed", lambda d: {"after0", "after1"} <= {x.get("order") for x in d})
    orders = {d["order"] for d in dets if d.get("rule_id") == "big_purchase"}
    assert {"before0", "before1", "before2", "after0", "after1"} <= orders

    # A restart on the same checkpoint starts and runs: the failed batch was committed.
    assert job.stop() == 0
    again = job.start()
    assert again["state"] == "running" and again["batch_failures"] == 0


@pytest.mark.parametrize("job_with_fault", [("--threshold-lane", "real-time")], indirect=True)
def test_a_failing_real_time_batch_is_quarantined_and_the_lane_goes_on(job_with_fault):
    """The poison fails both queries (each reads every record): each retries, then
    quarantines its own range; the lane's threshold detections go on after it."""
    broker, job = job_with_fault
    bs = broker.bootstrap
    now = int(time.time() * 1000)
    produce(bs, "events.q", _purchases("before", now - 30_000, 3))
    job.start()
    job.wait_for(lambda s: s.get("lag") == 0 and s["threshold_lane"].get("lag") == 0, timeout=120)

    poison = json.dumps({"type": "purchase", "order": "poison", "value": 500, "note": MARKER, "ts": _iso(now - 20_000)})
    produce(bs, "events.q", [*_purchases("same", now - 20_000, 2), poison])
    status = job.wait_for(lambda s: s["threshold_lane"].get("quarantined") and s.get("quarantined"), timeout=240)
    lane = status["threshold_lane"]
    assert lane["failures"] >= 2 and lane["last_failure"]["action"] == "quarantined"
    assert "injected fault" in lane["last_failure"]["error"]
    # The lane's range runs from its last committed batch to the broker's end: the
    # poison and the two records that came with it.
    lane_records = _in_ranges(bs, lane["quarantined"])
    assert poison in lane_records
    # Each query runs its failed batch again, its records set aside, and commits it.
    keyed_batch, lane_batch = status["quarantined"][0]["batch_id"], lane["quarantined"][0]["batch_id"]
    status = job.wait_for(lambda s: (s.get("last_batch_id") or -1) >= keyed_batch and s.get("lag") == 0
                          and (s["threshold_lane"].get("last_batch_id") or -1) >= lane_batch
                          and s["threshold_lane"].get("lag") == 0, timeout=120)
    assert job.proc.poll() is None and status["state"] == "running"

    dead = [json.loads(r.value) for r in read_all(bs, "events.deadletter")]
    from_lane = [d["raw"] for d in dead if d["reason"].startswith("quarantined: real-time batch")]
    assert sorted(from_lane) == sorted(lane_records)
    from_keyed = [d["raw"] for d in dead if d["reason"].startswith("quarantined: micro-batch")]
    assert sorted(from_keyed) == sorted(_in_ranges(bs, status["quarantined"]))
    assert not [d for d in detections(bs) if d.get("order") == "poison"]

    # Threshold detections after the quarantine come from the lane as usual.
    produce(bs, "events.q", _purchases("after", now - 10_000, 2))
    dets = wait_detections(bs, "events.processed", lambda d: {"after0", "after1"} <= {x.get("order") for x in d})
    orders = {d["order"] for d in dets if d.get("rule_id") == "big_purchase"}
    assert {"before0", "before1", "before2", "after0", "after1"} <= orders

