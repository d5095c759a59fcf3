"""`rulectl explain DETECTION_ID`: the evidence chain of one detection.

Prints, for a detection on the sink topic: the event it judged (from the event archive),
the rule version and its text (the record on `rules.active`), the commit and its author,
the backtest report the approver was shown (its checksum), the approver and time, the
publish's partition and offset, and the first detection of that version; each link is
checked against its own source (spark_jobs/lifecycle/evidence.py). `--replay` also
backtests the rule version over the archived events up to the event and checks that it
makes the same detection id.

Next to `rulectl up` it needs no options: the broker, the archive and the audit come
from the platform's state file (`var/platform.json`, or $RULES_PLATFORM_STATE), and it
runs on the platform's Spark Connect server (else a local Spark session). Exit
codes: 0 every link checked and held, 1 a link failed or could not be checked, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="the evidence chain of one detection", description=__doc__.splitlines()[0])
    p.add_argument("detection_id", metavar="DETECTION_ID", help="the detection's `detection_id` (32 hex characters)")
    p.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: the local platform's, else $KAFKA_BOOTSTRAP)")
    p.add_argument("--audit-dir", type=Path, default=None, help="directory of releases.jsonl (default: the platform's, else the settings')")
    p.add_argument("--archive", default=None, metavar="TABLE", help="the event archive (Delta table; default: the platform's)")
    p.add_argument("--repo", type=Path, default=None, help="git repository of the rules (default: the release's)")
    p.add_argument("--sink-topic", default=None)
    p.add_argument("--replay", action="store_true", help="also backtest the rule version over the archive up to the event")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=run)


def _platform() -> dict:
    from spark_jobs.kafka.client_config import DEFAULT_PLATFORM_STATE, PLATFORM_STATE_ENV

    path = Path(os.environ.get(PLATFORM_STATE_ENV) or DEFAULT_PLATFORM_STATE)
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def sources(args: argparse.Namespace):  # -> evidence.Sources
    """The platform's state file first (next to `rulectl up`), then the settings."""
    from spark_jobs.lifecycle.evidence import Sources
    from spark_jobs.lifecycle.settings import resolve_settings

    state = _platform()
    workdir = state.get("workdir")
    return Sources.from_settings(
        resolve_settings(use_airflow=False),
        audit_dir=args.audit_dir or (Path(workdir) / "airflow" / "rule_lifecycle" / "audit" if workdir else None),
        bootstrap=args.bootstrap or state.get("bootstrap") or os.environ.get("KAFKA_BOOTSTRAP"),
        archive_table=args.archive or (state.get("archive") or {}).get("table"),
        sink_topic=args.sink_topic, repo=args.repo,
    )


def run(args: argparse.Namespace) -> int:
    from spark_jobs.lifecycle.evidence import DETECTION_ID, explain

    if not DETECTION_ID.match(args.detection_id):
        print(f"rulectl explain: {args.detection_id!r} is not a detection id (32 lowercase hex characters)", file=sys.stderr)
        return 2
    src = sources(args)
    from spark_jobs.lifecycle.release import history_session
    from spark_jobs.lifecycle.settings import resolve_settings

    # The platform's warm Spark Connect server when it runs one, else a local session.
    spark = history_session(resolve_settings(use_airflow=False), "rulectl-explain")
    try:
        chain = explain(args.detection_id, src, spark=spark, replay=args.replay)
    finally:
        spark.stop()  # on a Connect server: this client's session, not the server
    if args.format == "json":
        print(json.dumps(chain.to_dict(), indent=2, default=str))
    else:
        print(render_text(chain.to_dict()))
    return 0 if chain.ok else 1


MARK = {True: "ok  ", False: "FAIL", None: "?   "}


def render_text(chain: dict) -> str:
    lines = [f"detection {chain['detection_id']}: {'every link checked' if chain['ok'] else 'NOT every link holds'}"]
    for link in chain["links"]:
        lines.append(f"[{MARK[link['ok']]}] {link['name']}: {link['check']}")
        for k, v in link["facts"].items():
            if v is None or v == [] or k == "rule":
                continue
            lines.append(f"         {k}: {v if not isinstance(v, dict | list) else json.dumps(v, default=str)}")
        if link["facts"].get("rule") is not None:
            lines.append(f"         rule: {json.dumps(link['facts']['rule'], sort_keys=True)}")
    return "\n".join(lines)
