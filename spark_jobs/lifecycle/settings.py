"""Settings of the rule lifecycle (release and scheduled-report DAGs).

Resolution order, highest first: the DAG run's conf/params, the Airflow Variable
`rule_lifecycle` (a JSON object), environment variables `RULE_LIFECYCLE_<NAME>`, then
the defaults below. The defaults run the embedded demo from a checkout of this
project (the project repository is the rules repository, broker on 127.0.0.1:9092),
so nothing needs configuring to try it; production sets the Variable.

Settings are resolved once, by the first task of a run, and travel with the run
(XCom), so an edit to the Variable never changes a run half-way through.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from spark_jobs import layered_settings

VARIABLE_NAME = "rule_lifecycle"
ENV_PREFIX = "RULE_LIFECYCLE_"

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _default_state_dir() -> str:
    home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
    return str(Path(home) / "rule_lifecycle")


def _default_archive_table() -> str:
    """$RULES_ARCHIVE_TABLE (`rulectl up` sets it to its work folder's table), else the
    table under this checkout's `var/`."""
    return os.environ.get("RULES_ARCHIVE_TABLE") or str(PROJECT_ROOT / "var" / "archive" / "events")


def _default_inputs() -> dict[str, str]:
    demo = PROJECT_ROOT / "tests" / "data" / "demo"
    return {
        "events.raw": str(demo / "events.raw.jsonl"),
        "context.raw": str(demo / "context.raw.jsonl"),
    }


@dataclass
class LifecycleSettings:
    """Every knob of the lifecycle; see module docstring for where values come from."""

    # The rules git repository (a local path or any URL git can fetch) and what to track.
    repo: str = str(PROJECT_ROOT)
    branch: str = "main"
    rules_dir: str = "rules"
    # Where checkouts, reports, Data Docs and the audit log live (shared by all workers).
    state_dir: str = field(default_factory=_default_state_dir)
    report_dir: str = ""
    audit_dir: str = ""
    # Event history the backtests read: topic -> JSON Lines file or Parquet dir.
    history_inputs: dict[str, str] = field(default_factory=_default_inputs)
    # The folder a trigger's `history_inputs` (relative paths) are read from: a run can
    # choose files under it and nowhere else (spark_jobs/lifecycle/params.py).
    history_root: str = str(PROJECT_ROOT / "tests" / "data" / "demo")
    history_lookback_hours: float = 24.0
    # "latest": the window ends at the newest event of the history (recordings);
    # "interval": it ends at the run's data interval end (live daily exports).
    history_window_end: str = "latest"
    # Keep only the window's records in what the backtest reads.
    history_slice: bool = True
    # The event archive (spark_jobs/archive): a Delta table of every event record.
    # "auto": backtests read the archive's last `archive_lookback_hours` when the table
    # exists, else `history_inputs`; "archive" / "files" force one.
    history_source: str = "auto"
    archive_table: str = field(default_factory=_default_archive_table)
    archive_lookback_hours: float = 24.0
    # Partitions older than this are deleted by the archive_maintenance DAG; VACUUM keeps
    # files older versions reference for `archive_vacuum_hours`.
    archive_retention_days: float = 30.0
    archive_vacuum_hours: float = 168.0
    time_field: str = "timestamp"
    sink_topic: str = "events.processed"
    shadow_topic: str = "events.shadow"  # detections of shadow rule versions
    # Kafka: an Airflow connection (kafka type, extra {"bootstrap.servers": ...}) wins
    # over `bootstrap` when it exists.
    kafka_conn_id: str = "rules_kafka"
    bootstrap: str = "127.0.0.1:9092"
    rules_topic: str = "rules.active"
    # Spark: an Airflow connection (spark type) wins over `spark_master` when it exists.
    spark_conn_id: str = "spark_rules"
    spark_master: str = "local[2]"
    spark_conf: dict[str, str] = field(
        default_factory=lambda: {
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
            "spark.sql.session.timeZone": "UTC",
        }
    )
    # Where the history checks and backtests of releases and daily reports run: "auto" =
    # the Spark Connect server of the `rulectl up` this Airflow belongs to (found through
    # its state file, $RULES_PLATFORM_STATE) when it is running, else Spark started by
    # each task; "local" = always Spark started by each task; "sc://HOST:PORT" = that
    # server. A warm server saves each task a JVM start and a cold JIT, most of a
    # release's time on a small machine. Not a run param: a trigger must not send the work elsewhere.
    spark_remote: str = "auto"
    # A history window of at most this many records is checked by Great Expectations'
    # pandas engine on the columns Spark read (collected to the task), above it by GX on
    # Spark: one Spark query per expectation costs more than a small window's checks.
    quality_collect_max_rows: int = 2_000_000
    # Rows per rule in the added/removed tables of a report.
    report_max_rows: int = 200
    # Telling approvers a release waits (plugins/rule_lifecycle/notifiers.py): "file"
    # (a 0600 JSON Lines file under state_dir, and the task log) or "smtp" (mail to
    # approvers_email through the Airflow connection smtp_conn_id).
    approval_notify: str = "file"
    approvers_email: str = ""
    smtp_conn_id: str = "smtp_default"

    def __post_init__(self) -> None:
        if not self.report_dir:
            self.report_dir = str(Path(self.state_dir) / "reports")
        if not self.audit_dir:
            self.audit_dir = str(Path(self.state_dir) / "audit")
        if self.approval_notify not in ("file", "smtp"):
            raise ValueError(f"approval_notify must be 'file' or 'smtp', not {self.approval_notify!r}")
        if self.history_source not in ("auto", "archive", "files"):
            raise ValueError(f"history_source must be 'auto', 'archive' or 'files', not {self.history_source!r}")
        if self.history_window_end not in ("latest", "interval"):
            raise ValueError(f"history_window_end must be 'latest' or 'interval', not {self.history_window_end!r}")
        if self.spark_remote not in ("auto", "local") and not self.spark_remote.startswith("sc://"):
            raise ValueError(f"spark_remote must be 'auto', 'local' or sc://HOST:PORT, not {self.spark_remote!r}")

    @property
    def checkout_dir(self) -> Path:
        return Path(self.state_dir) / "checkouts"

    @property
    def mirror_dir(self) -> Path:
        return Path(self.state_dir) / "mirror.git"

    @property
    def work_dir(self) -> Path:
        return Path(self.state_dir) / "work"

    def remote_url(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The Spark Connect server to run on (see `spark_remote`), or None for Spark
        of the task's own. "auto" offers only a server that answers now: a task that
        finds none starts its own Spark instead of failing."""
        if self.spark_remote == "local":
            return None
        if self.spark_remote.startswith("sc://"):
            return self.spark_remote
        return platform_connect_url(environ)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> LifecycleSettings:
        return layered_settings.from_dict(cls, data, VARIABLE_NAME)


def env_settings(environ: Mapping[str, str] | None = None) -> dict:
    return layered_settings.env_settings(LifecycleSettings, ENV_PREFIX, environ)


def resolve_settings(overrides: Mapping | None = None, *, use_airflow: bool = True) -> LifecycleSettings:
    """Defaults < env < Airflow Variable < overrides.

    `overrides` is trusted (code, tests); a DAG run's params go through
    `run_settings`, which allow-lists them first."""
    return layered_settings.resolve(LifecycleSettings, VARIABLE_NAME, ENV_PREFIX, overrides, use_airflow)


def run_settings(params: Mapping, model: type | None = None, *, use_airflow: bool = True) -> LifecycleSettings:
    """The settings of one DAG run from its params, after the allow-list
    (`spark_jobs.lifecycle.params`): only documented keys, history inputs under the
    configured `history_root`. Raises ParamsRejected."""
    from spark_jobs.lifecycle import params as p

    validated = p.validate_params(model or p.ReleaseParams, params)
    extra = p.overrides(validated)
    base = resolve_settings(use_airflow=use_airflow)
    if "history_inputs" in extra:
        extra["history_inputs"] = p.resolve_history_inputs(base.history_root, extra["history_inputs"])
        # A run that names its history files means those files, archive or not.
        if base.history_source == "auto":
            extra["history_source"] = "files"
    return resolve_settings({**base.to_dict(), **extra}, use_airflow=False)


def platform_connect_url(environ: Mapping[str, str] | None = None) -> str | None:
    """sc://127.0.0.1:PORT of the Spark Connect server that the local `rulectl up`
    runs, from its state file ($RULES_PLATFORM_STATE, which it gives Airflow), when the
    server is marked running and its port accepts a connection; else None."""
    import json
    import socket

    from spark_jobs.kafka.client_config import PLATFORM_STATE_ENV
    from spark_jobs.spark import DEFAULT_CONNECT_PORT

    env = os.environ if environ is None else environ
    state_file = env.get(PLATFORM_STATE_ENV)
    if not state_file:
        return None
    try:
        connect = json.loads(Path(state_file).read_text(encoding="utf-8"))["components"]["connect"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(connect, dict) or not connect.get("running"):
        return None
    argv = [str(a) for a in connect.get("argv") or []]
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv[:-1] else DEFAULT_CONNECT_PORT
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
    except OSError:
        return None
    return f"sc://127.0.0.1:{port}"
