"""Two release runs that polled the same new commit: exactly one asks for approval.

Seen on a platform left running: two scheduled runs of rule_release detected one commit
seconds apart and both waited for approval. The claim is a check-and-append under the
audit's lock (spark_jobs.lifecycle.audit.append_unless)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
from pathlib import Path

from spark_jobs.lifecycle import audit
from spark_jobs.lifecycle.release import claim_release
from spark_jobs.lifecycle.settings import LifecycleSettings


def _candidate(state: Path, commit: str = "c" * 40) -> dict:
    settings = LifecycleSettings(repo="/nowhere", branch="main", state_dir=str(state))
    return {"commit": commit, "short": commit[:7], "repo": "/nowhere", "branch": "main", "settings": settings.to_dict()}


def test_the_second_run_for_a_commit_stands_down(tmp_path: Path) -> None:
    cand = _candidate(tmp_path)
    first = claim_release(cand, dag_id="rule_release", run_id="scheduled__1")
    second = claim_release(cand, dag_id="rule_release", run_id="scheduled__2")
    assert first["claimed"] is True and second == {"claimed": False, "held_by": "scheduled__1", "superseded": []}
    detected = [r["run_id"] for r in audit.read_records(tmp_path / "audit") if r["event"] == "detected"]
    assert detected == ["scheduled__1"]
    # Once the first run is decided, the commit is no longer held (a manual re-run may take it).
    audit.append_record(tmp_path / "audit", {"event": "rejected", "run_id": "scheduled__1", "commit": cand["commit"]})
    assert claim_release(cand, dag_id="rule_release", run_id="manual__3")["claimed"] is True


def _claim(state: str, run_id: str, barrier: multiprocessing.synchronize.Barrier, out: multiprocessing.Queue) -> None:
    barrier.wait()
    out.put(claim_release(_candidate(Path(state)), dag_id="rule_release", run_id=run_id)["claimed"])


def test_claims_at_the_same_moment_give_the_commit_to_one_run(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    for attempt in range(5):
        state = tmp_path / f"s{attempt}"
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_claim, args=(str(state), f"run{i}", barrier, out)) for i in range(4)]
        for proc in procs:
            proc.start()
        claimed = sorted(out.get(timeout=60) for _ in procs)
        for proc in procs:
            proc.join(timeout=60)
        assert claimed == [False, False, False, True]
        assert len([r for r in audit.read_records(state / "audit") if r["event"] == "detected"]) == 1
