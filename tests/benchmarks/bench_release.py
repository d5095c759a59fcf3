"""Seconds from a rule commit to its approval request, per task of `rule_release`.

    python tests/benchmarks/bench_release.py --start --workdir /tmp/bench/var \\
        --port 19092 --airflow-port 18080 --fill-minutes 5 [--runs 2]
    python tests/benchmarks/bench_release.py --workdir /tmp/bench/var --airflow-port 18080
    python tests/benchmarks/bench_release.py --workdir /tmp/bench/var --airflow-port 18080 \\
        --observe RUN_ID --t0 EPOCH_SECONDS --label before

On a running platform (`rulectl up`; `--start` starts one and stops it at the end, with
SIGINT, after letting the demo fill the event archive for `--fill-minutes`), the
release DAG is pointed at a throw-away clone of this repository (the Airflow Variable
`rule_lifecycle`), so no commit lands in the project's history. Each run commits a
change of `rapid_clicks` to the clone and times, from the commit: the sensor's
detection, every task's queue/start/end, and the approval request (the HITL detail's
creation). The request is then rejected (as the `approver` demo user), so the next run
starts from the same live rules. `--observe` only reads the figures of a run that
already happened. Each run appends one JSON line to tests/benchmarks/results.jsonl
(record.py: date, project commit, CPU model, cores, load averages; the figures per task).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import RESULTS, append_result, load  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DAG = "rule_release"
RULE_FILE = Path("rules") / "rapid_clicks.yaml"


class Airflow:
    """The platform's REST API as one of its demo users (passwords from the workdir)."""

    def __init__(self, base: str, users_file: Path) -> None:
        self.base = base.rstrip("/")
        self.users_file = users_file
        self._tokens: dict[str, str] = {}

    def _token(self, user: str) -> str:
        if user not in self._tokens:
            users = {u["username"]: u["password"] for u in json.loads(self.users_file.read_text())}
            body = json.dumps({"username": user, "password": users[user]}).encode()
            req = urllib.request.Request(f"{self.base}/auth/token", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                self._tokens[user] = json.loads(resp.read())["access_token"]
        return self._tokens[user]

    def api(self, method: str, path: str, body: object = None, user: str = "operator") -> dict:
        req = urllib.request.Request(
            f"{self.base}/api/v2{path}",
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"Bearer {self._token(user)}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else {}

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/api/v2/monitor/health", timeout=5) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _ts(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def start_platform(args: argparse.Namespace) -> subprocess.Popen:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log = (workdir.parent / "up.log").open("w")
    argv = [sys.executable, "-m", "spark_jobs.cli", "up", "--workdir", str(workdir), "--port", str(args.port),
            "--airflow-port", str(args.airflow_port)]
    return subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_platform(proc: subprocess.Popen) -> None:
    """SIGINT (what Ctrl-C sends: `rulectl up` stops its children in order), then wait."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # a second Ctrl-C: stop without waiting
            proc.wait(timeout=60)


def track_clone(af: Airflow, clone: Path) -> None:
    """A throw-away clone of this repository, tracked by the release DAG instead of it."""
    if not (clone / ".git").is_dir():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    value = json.dumps({"repo": str(clone), "branch": git(clone, "rev-parse", "--abbrev-ref", "HEAD")})
    try:
        af.api("PATCH", "/variables/rule_lifecycle", {"key": "rule_lifecycle", "value": value})
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        af.api("POST", "/variables", {"key": "rule_lifecycle", "value": value})


def commit_change(clone: Path) -> tuple[float, str]:
    """Bump rapid_clicks' version and toggle its threshold; returns (commit time, sha)."""
    path = clone / RULE_FILE
    lines = path.read_text().splitlines()
    out = []
    for line in lines:
        if line.startswith("version:"):
            line = f'version: "{int(line.split(chr(34))[1]) + 1}"'
        elif line.startswith("threshold:"):
            line = f"threshold: {9 if line.split(':')[1].strip() == '10' else 10}"
        out.append(line)
    path.write_text("\n".join(out) + "\n")
    git(clone, "add", str(RULE_FILE))
    git(clone, "-c", "user.name=Bench Author", "-c", "user.email=bench@example.com", "commit", "-q", "-m",
        "bench: rapid_clicks threshold")
    t0 = time.time()
    return t0, git(clone, "rev-parse", "HEAD")


def find_run(af: Airflow, sha: str, timeout: float) -> str:
    """The rule_release run whose sensor took `sha`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = af.api("GET", f"/dags/{DAG}/dagRuns?order_by=-run_after&limit=5")["dag_runs"]
        for run in runs:
            rid = quote(run["dag_run_id"], safe="")
            try:
                x = af.api("GET", f"/dags/{DAG}/dagRuns/{rid}/taskInstances/detect_commit/xcomEntries/return_value")
            except urllib.error.HTTPError:
                continue
            value = x.get("value")
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError:
                    value = {}
            if isinstance(value, dict) and value.get("commit") == sha:
                return run["dag_run_id"]
        time.sleep(2)
    raise TimeoutError(f"no {DAG} run took {sha[:12]} within {timeout:.0f} s")


def wait_for_approval(af: Airflow, run_id: str, timeout: float) -> dict | None:
    """The run's HITL detail once the approval is requested; None if the run ended first."""
    deadline = time.time() + timeout
    rid = quote(run_id, safe="")
    while time.time() < deadline:
        details = af.api("GET", f"/dags/{DAG}/dagRuns/{rid}/hitlDetails").get("hitl_details") or []
        if details:
            return details[0]
        if af.api("GET", f"/dags/{DAG}/dagRuns/{rid}")["state"] in ("failed", "success"):
            return None
        time.sleep(1)
    raise TimeoutError(f"no approval request in run {run_id} within {timeout:.0f} s")


def figures(af: Airflow, run_id: str, t0: float, hitl: dict | None) -> dict:
    """Per task: queued, start and end (seconds after the commit) and duration."""
    rid = quote(run_id, safe="")
    tis = af.api("GET", f"/dags/{DAG}/dagRuns/{rid}/taskInstances")["task_instances"]
    tasks = {}
    for ti in tis:
        q, s, e = _ts(ti.get("queued_when")), _ts(ti.get("start_date")), _ts(ti.get("end_date"))
        if s is None:
            continue
        tasks[ti["task_id"]] = {
            "state": ti["state"],
            "queued_s": None if q is None else round(q - t0, 1),
            "start_s": round(s - t0, 1),
            "end_s": None if e is None else round(e - t0, 1),
            "duration_s": None if ti.get("duration") is None else round(float(ti["duration"]), 1),
        }
    created = _ts((hitl or {}).get("created_at")) if hitl else None
    if created is None and "approve" in tasks:
        created = tasks["approve"]["start_s"] + t0
    detect = tasks.get("detect_commit", {}).get("end_s")
    return {
        "run_id": run_id,
        "commit_to_approval_s": None if created is None else round(created - t0, 1),
        "commit_to_detection_s": detect,
        "tasks": dict(sorted(tasks.items(), key=lambda kv: kv[1]["start_s"])),
    }


def reject(af: Airflow, hitl: dict) -> None:
    ti = hitl["task_instance"]
    path = (f"/dags/{ti['dag_id']}/dagRuns/{quote(ti['dag_run_id'], safe='')}/taskInstances/{ti['task_id']}/"
            f"{ti.get('map_index', -1)}/hitlDetails")
    try:
        af.api("PATCH", path, {"chosen_options": ["Reject"], "params_input": {"comment": "benchmark run"}},
               user="approver")
    except urllib.error.HTTPError as exc:
        print(f"could not reject the benchmark's approval ({exc.code}); answer it in the UI", file=sys.stderr)


def archive_records(workdir: Path) -> int | None:
    status = workdir / "archive" / "status.json"
    try:
        doc = json.loads(status.read_text())
    except (OSError, ValueError):
        return None
    for key in ("rows_archived", "records"):
        if isinstance(doc.get(key), int):
            return doc[key]
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, help="the platform's workdir (rulectl up --workdir)")
    ap.add_argument("--airflow-port", type=int, default=8080)
    ap.add_argument("--port", type=int, default=9092, help="broker port, with --start")
    ap.add_argument("--start", action="store_true", help="start `rulectl up` here and stop it at the end")
    ap.add_argument("--fill-minutes", type=float, default=5.0, help="with --start: the demo fills the archive first")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--clone", default=None, help="throw-away clone to track (default: next to the workdir)")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--label", default="", help="free text kept with the figures (e.g. before/after)")
    ap.add_argument("--observe", metavar="RUN_ID", help="only read the figures of this run")
    ap.add_argument("--t0", type=float, help="with --observe: the commit's time (epoch seconds)")
    ap.add_argument("--project-commit", help="with --observe: the project commit the run ran (default HEAD)")
    ap.add_argument("--run-load", help="with --observe: the load averages during the run, as noted then")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()

    workdir = Path(args.workdir).resolve()
    af = Airflow(f"http://127.0.0.1:{args.airflow_port}", workdir / "airflow" / "demo-users.json")
    proc = start_platform(args) if args.start else None
    try:
        deadline = time.time() + 600
        while not (af.healthy() and af.users_file.is_file()):
            if time.time() > deadline or (proc is not None and proc.poll() is not None):
                raise RuntimeError("the platform's Airflow did not come up")
            time.sleep(3)
        base = {"label": args.label, "workdir": str(workdir)}
        if args.observe:
            if args.t0 is None:
                ap.error("--observe needs --t0")
            found = af.api("GET", f"/dags/{DAG}/dagRuns/{quote(args.observe, safe='')}/hitlDetails").get("hitl_details")
            context = {**base, "date": datetime.fromtimestamp(args.t0, UTC).isoformat(timespec="seconds"),
                       "load_avg_when_observed": load(), "load_avg": args.run_load}
            if args.project_commit:
                context["project_commit"] = args.project_commit
            result = append_result("release", figures(af, args.observe, args.t0, (found or [None])[0]),
                                   results=args.results, **context)
            print(json.dumps(result, indent=1))
            return 0
        clone = Path(args.clone) if args.clone else workdir.parent / "bench-rules-repo"
        track_clone(af, clone)
        if proc is not None:
            print(f"letting the demo fill the archive for {args.fill_minutes} min", flush=True)
            time.sleep(args.fill_minutes * 60)
        for n in range(args.runs):
            load_before = load()
            t0, sha = commit_change(clone)
            run_id = find_run(af, sha, args.timeout)
            hitl = wait_for_approval(af, run_id, args.timeout)
            result = append_result(
                "release", figures(af, run_id, t0, hitl), results=args.results,
                **base, date=datetime.fromtimestamp(t0, UTC).isoformat(timespec="seconds"), commit=sha,
                load_avg_before=load_before, archive_records=archive_records(workdir))
            print(f"run {n + 1}: commit -> approval request {result['commit_to_approval_s']} s "
                  f"(detected after {result['commit_to_detection_s']} s; load {result['load_avg']})", flush=True)
            for task, f in result["tasks"].items():
                print(f"  {task:20} start {f['start_s']:>7} s  end {f['end_s']!s:>7} s  ({f['duration_s']} s)")
            if hitl is not None:
                reject(af, hitl)
                time.sleep(5)
    finally:
        if proc is not None:
            stop_platform(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
