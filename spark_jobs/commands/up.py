"""`rulectl up`: the whole platform on one machine, started and stopped as one.

One command, in this order: the embedded Apache Kafka broker on 127.0.0.1:9092 with
the platform's topics; `rules.active` bootstrapped if it is empty (the committed rules,
audited as a bootstrap; otherwise nothing is published: changes go live through an
approved release, spark_jobs/lifecycle/bootstrap.py); the detection job (`rulectl detect`, Spark local mode); the event archive (`rulectl
archive`: events.raw and context.raw into the Delta table `<workdir>/archive/events`,
which backtests and reports read); the demo generator
(`rulectl demo --forever`); Airflow (api-server with the UI, scheduler, DAG processor,
triggerer) with this repository's dags/ and plugins/. Ctrl-C or SIGTERM stops them in
reverse order, each with its graceful signal (a second Ctrl-C stops without waiting).

Airflow runs with its production auth manager (FAB: users and roles in the metadata
DB), not `airflow standalone`, which forces the development-only simple auth manager.
Before its components start, the metadata DB is migrated and the platform's roles and
one demo user per role (author, approver, viewer, operator; see
spark_jobs/platform/identity.py) are provisioned. Their passwords are generated once
per workdir and kept in `<workdir>/airflow/demo-users.json`, readable by its owner only;
the terminal shows where, never the passwords themselves.

Supervision policy (spark_jobs.platform.launcher):
* the detection job is **restarted** when it exits: from its checkpoint, so no event is
  lost. A clean exit (code 0) is how a restart is requested (the detection supervisor
  sends SIGTERM to the pid in `<workdir>/platform.json`); a crash is retried with
  backoff, at most 5 times in 10 minutes, after which the platform stops;
* the archive job is restarted the same way (its checkpoint and Delta's transaction log
  make a restart neither lose nor double a record);
* any other component that exits (broker, demo, Airflow) stops the platform, with the
  last lines of its log: none of them is expected to exit while the platform runs.

Kafka runs with SASL/SCRAM users and ACLs (spark_jobs/kafka/security.py): one principal
per role, passwords generated once per workdir into `<workdir>/kafka-credentials.json`
(0600, never printed), and every child authenticates as its role through
`KAFKA_CREDENTIALS_FILE` (spark_jobs/kafka/client_config.py): only the release path
(`publisher`) may write `rules.active`. `--insecure` runs a plaintext broker without
users or ACLs, for development only: any local process may then rewrite the rules
(signed records still keep a forged rule out of the job).

The broker keeps its log in `<workdir>/kafka` and the job its checkpoint in
`<workdir>/detect`, so a second `rulectl up` resumes where the first stopped. Airflow's
home (database, logs, demo users' passwords) persists in `<workdir>/airflow`.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from spark_jobs.commands.signals import install_handlers
from spark_jobs.commands.signals import restore_handlers as _restore_handlers
from spark_jobs.platform.identity import AUTH_MANAGER, DEMO_USERS
from spark_jobs.platform.launcher import BrokerComponent, ChildProcess, ChildSpec, RestartPolicy, Supervisor
from spark_jobs.spark import DEFAULT_CONNECT_PORT

PROJECT_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")
# The Spark jobs, the Connect server and the demo producer stop together: none needs
# another to shut down, only the broker, which stops after them.
JOBS = "jobs"
DETECT_RESTART = RestartPolicy(max_restarts=5, window_s=600.0, backoff_s=2.0, max_backoff_s=30.0)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up",
        help="run the whole platform locally: broker, rules, detection job, demo, Airflow",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--port", type=int, default=9092, help="broker port on 127.0.0.1 (default: 9092)")
    p.add_argument(
        "--partitions", type=int, default=2, help="partitions of events.raw / context.raw (default: 2)"
    )
    p.add_argument("--airflow-port", type=int, default=8080, help="Airflow UI/API port (default: 8080)")
    p.add_argument(
        "--airflow-host", default="127.0.0.1", help="Airflow UI listen address (default: 127.0.0.1)"
    )
    p.add_argument(
        "--airflow-db",
        default=None,
        metavar="URL",
        help="Airflow metadata DB URL (default: SQLite in the workdir)",
    )
    p.add_argument("--no-airflow", action="store_true", help="do not start Airflow")
    p.add_argument("--no-demo", action="store_true", help="do not start the demo event generator")
    p.add_argument(
        "--no-detect", action="store_true", help="do not start the detection job (e.g. to run it yourself)"
    )
    p.add_argument(
        "--demo-rate", type=float, default=20.0, help="demo background events per second (default: 20)"
    )
    p.add_argument(
        "--no-archive", action="store_true", help="do not start the event archive job (rulectl archive)"
    )
    p.add_argument(
        "--no-connect",
        action="store_true",
        help="do not start the Spark Connect server for backtests (rulectl connect, port 15002)",
    )
    p.add_argument(
        "--connect-port", type=int, default=DEFAULT_CONNECT_PORT,
        help=f"port of the Spark Connect server on 127.0.0.1 (default: {DEFAULT_CONNECT_PORT})",
    )
    p.add_argument("--trigger-ms", type=int, default=None, help="detection job micro-batch trigger interval")
    p.add_argument("--archive-trigger-ms", type=int, default=None,
                   help="event archive micro-batch trigger interval (rulectl archive --trigger-ms)")
    p.add_argument(
        "--threshold-lane", choices=["real-time", "micro-batch"], default="real-time",
        help="where the detection job runs threshold rules (rulectl detect --threshold-lane; default: real-time)",
    )
    p.add_argument(
        "--rules", default=str(PROJECT_ROOT / "rules"), metavar="DIR", help="rules to publish at start"
    )
    p.add_argument("--workdir", default="var", help="state, checkpoints and logs (default: ./var)")
    p.add_argument(
        "--insecure", action="store_true",
        help="development only, not for production: Kafka without SASL users and ACLs (any local "
             "client may write rules.active)",
    )
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Paths:
    """Where everything of one `rulectl up` lives; all under the workdir."""

    workdir: Path

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def detect_dir(self) -> Path:
        return self.workdir / "detect"

    @property
    def kafka_dir(self) -> Path:
        """The embedded broker's log: kept across runs, like the job's checkpoint."""
        return self.workdir / "kafka"

    @property
    def checkpoint(self) -> Path:
        return self.detect_dir / "checkpoint"

    @property
    def status_file(self) -> Path:
        return self.detect_dir / "status.json"

    @property
    def archive_dir(self) -> Path:
        return self.workdir / "archive"

    @property
    def archive_table(self) -> Path:
        """The event archive (Delta); kept across runs like the broker log."""
        return self.archive_dir / "events"

    @property
    def archive_checkpoint(self) -> Path:
        return self.archive_dir / "checkpoint"

    @property
    def archive_status_file(self) -> Path:
        return self.archive_dir / "status.json"

    @property
    def airflow_home(self) -> Path:
        return self.workdir / "airflow"

    @property
    def state_file(self) -> Path:
        return self.workdir / "platform.json"

    @property
    def signing_key_file(self) -> Path:
        """The HMAC key of rule records (0600): publisher and job only."""
        return self.workdir / "rules-signing.key"

    @property
    def kafka_credentials_file(self) -> Path:
        """The Kafka principals' passwords (0600): the broker's users, every client's
        credentials (spark_jobs/kafka/client_config.py)."""
        return self.workdir / "kafka-credentials.json"

    @property
    def connections_file(self) -> Path:
        """Airflow connections with credentials (0600), read by its secrets backend."""
        return self.airflow_home / "connections.json"

    @property
    def users_file(self) -> Path:
        """The demo users and their passwords (0600)."""
        return self.airflow_home / "demo-users.json"


def rulectl_argv(*args: str) -> list[str]:
    """Run a rulectl command with this interpreter (works without `rulectl` on PATH)."""
    return [sys.executable, "-m", "spark_jobs.cli", *args]


def base_env(bootstrap: str, paths: Paths, secure: bool = True) -> dict[str, str]:
    """The environment every child gets: where Kafka is and how to authenticate (the
    credentials file's path, never a password), which Python Spark uses."""
    from spark_jobs.kafka.client_config import CREDENTIALS_ENV

    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "KAFKA_BOOTSTRAP": bootstrap,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "RULES_PLATFORM_STATE": str(paths.state_file),
        "RULES_DETECT_CHECKPOINT": str(paths.checkpoint),
        "RULES_DETECT_STATUS_FILE": str(paths.status_file),
        # Where the archive job writes and backtests/reports read (lifecycle settings).
        "RULES_ARCHIVE_TABLE": str(paths.archive_table),
        # The publisher (Airflow's publish task, `rulectl up` itself) signs rule records
        # with this key and the detection job refuses any it cannot verify.
        "RULES_SIGNING_KEY_FILE": str(paths.signing_key_file),
    }
    env.pop(CREDENTIALS_ENV, None)
    env.pop("KAFKA_PRINCIPAL", None)  # each child acts as its own role
    if secure:
        env[CREDENTIALS_ENV] = str(paths.kafka_credentials_file)
    return env


def detect_spec(args: argparse.Namespace, bootstrap: str, paths: Paths) -> ChildSpec:
    # The job runs under `rulectl runner`, which obeys the supervisor's restart requests
    # on detect.control (the same path as on a cluster) and restarts a crashed driver.
    argv = rulectl_argv(
        "runner",
        "--bootstrap", bootstrap,
        "--log", str(paths.logs / "driver.log"),
        "--",
        "--checkpoint", str(paths.checkpoint),
        "--status-file", str(paths.status_file),
        "--archive", str(paths.archive_table),
    )  # fmt: skip
    if args.trigger_ms is not None:
        argv += ["--trigger-ms", str(args.trigger_ms)]
    argv += ["--threshold-lane", args.threshold_lane]
    return ChildSpec(
        name="detect",
        stop_group=JOBS,
        argv=argv,
        env=base_env(bootstrap, paths, not args.insecure),
        cwd=paths.workdir,
        log_path=paths.logs / "detect.log",
        stop_signal=signal.SIGTERM,  # the job's graceful stop: finish the batch, commit, exit 0
        stop_timeout=60.0,
        restart=DETECT_RESTART,
        # The job writes its status file once running; the file of the previous run is
        # removed before every (re)start so that "ready" means this run.
        before_start=lambda: paths.status_file.unlink(missing_ok=True),
        ready=lambda: paths.status_file.exists(),
        ready_message=f"detection job running (status: {paths.status_file})",
    )


def archive_spec(args: argparse.Namespace, bootstrap: str, paths: Paths) -> ChildSpec:
    """The event archive job, supervised like the detection job: restarted when it
    exits, from its checkpoint (nothing lost, nothing doubled)."""
    argv = rulectl_argv(
        "archive",
        "--bootstrap", bootstrap,
        "--table", str(paths.archive_table),
        "--checkpoint", str(paths.archive_checkpoint),
        "--status-file", str(paths.archive_status_file),
    )  # fmt: skip
    if args.archive_trigger_ms is not None:
        argv += ["--trigger-ms", str(args.archive_trigger_ms)]
    # Its batches are small appends: a smaller driver than the detection job's 4g.
    env = {"SPARK_DRIVER_MEMORY": "1g", **base_env(bootstrap, paths, not args.insecure)}
    return ChildSpec(
        name="archive",
        stop_group=JOBS,
        argv=argv,
        env=env,
        cwd=paths.workdir,
        log_path=paths.logs / "archive.log",
        stop_signal=signal.SIGTERM,
        stop_timeout=60.0,
        restart=DETECT_RESTART,
        before_start=lambda: paths.archive_status_file.unlink(missing_ok=True),
        ready=lambda: paths.archive_status_file.exists(),
        ready_message=f"event archive running (table: {paths.archive_table})",
    )


def connect_spec(args: argparse.Namespace, bootstrap: str, paths: Paths, port: int = DEFAULT_CONNECT_PORT) -> ChildSpec:
    """A warm Spark for backtests (`rulectl backtest --remote sc://127.0.0.1:PORT`): no
    JVM start-up per backtest, and a JIT that has seen the engine's plans before."""
    return ChildSpec(
        name="connect",
        stop_group=JOBS,
        argv=rulectl_argv("connect", "--port", str(port)),
        env=base_env(bootstrap, paths, not args.insecure),
        cwd=paths.workdir,
        log_path=paths.logs / "connect.log",
        stop_signal=signal.SIGTERM,
        stop_timeout=30.0,
        restart=DETECT_RESTART,
        ready=lambda: _port_open("127.0.0.1", port),
        ready_message=f"Spark Connect server on sc://127.0.0.1:{port} (rulectl backtest --remote)",
    )


def _port_open(host: str, port: int) -> bool:
    import socket

    try:
        socket.create_connection((host, port), 0.5).close()
    except OSError:
        return False
    return True


def demo_spec(args: argparse.Namespace, bootstrap: str, paths: Paths) -> ChildSpec:
    return ChildSpec(
        name="demo",
        stop_group=JOBS,
        argv=rulectl_argv("demo", "--bootstrap", bootstrap, "--forever", "--rate", f"{args.demo_rate:g}"),
        env=base_env(bootstrap, paths, not args.insecure),
        cwd=paths.workdir,
        log_path=paths.logs / "demo.log",
        stop_signal=signal.SIGTERM,
        stop_timeout=20.0,
        echo=True,  # its pattern announcements tell the user what to look for
    )


def airflow_url(args: argparse.Namespace) -> str:
    """Where this machine reaches the Airflow API (a wildcard listen address is local)."""
    host = "127.0.0.1" if args.airflow_host in ("0.0.0.0", "::", "") else args.airflow_host
    return f"http://{host}:{args.airflow_port}"


def airflow_binary() -> str | None:
    """The `airflow` of this interpreter's environment, else the one on PATH."""
    local = Path(sys.executable).parent / "airflow"
    if local.exists():
        return str(local)
    return shutil.which("airflow")


def demo_users(paths: Paths) -> list[dict]:
    """The demo users (one per role, and a second approver) with their passwords: generated on the first start
    of a workdir, then kept in `demo-users.json` (mode 0600), which is also what
    `spark_jobs.platform.identity` provisions from."""
    from spark_jobs.platform import identity

    f = paths.users_file
    kept: dict[str, str] = {}
    if f.exists():
        try:
            kept = {u["username"]: u["password"] for u in json.loads(f.read_text() or "[]")}
        except (ValueError, KeyError, TypeError):
            kept = {}
    names = [*identity.DEMO_USERS, identity.SERVICE_USER]
    passwords = {**identity.generate_passwords(names), **{k: v for k, v in kept.items() if k in names}}
    specs = [*identity.demo_user_specs(passwords), identity.service_user_spec(passwords[identity.SERVICE_USER])]
    identity.write_secret_file(f, specs)  # (re)written 0600 even if someone loosened it
    return specs


def write_connections(paths: Paths, args: argparse.Namespace, users: list[dict]) -> Path:
    """The Airflow connections of the platform, for a local-filesystem secrets backend
    (0600): the release DAG's API account (`rule_lifecycle_api`) and, with Kafka
    security on, the detection supervisor's Kafka connections with the `supervisor`
    principal's SASL settings in their extra (off: they are plain AIRFLOW_CONN_*
    variables, `airflow_env`)."""
    from spark_jobs.kafka.client_config import KafkaClientSettings, confluent_config
    from spark_jobs.platform import identity
    from spark_jobs.platform.control import airflow_connections

    conns = identity.api_connection(airflow_url(args), user_password(users, identity.SERVICE_USER))
    if not args.insecure:
        kafka = KafkaClientSettings(credentials_file=str(paths.kafka_credentials_file))
        conns.update(airflow_connections(f"127.0.0.1:{args.port}", confluent_config("supervisor", kafka)))
    return identity.write_secret_file(paths.connections_file, conns)


def user_password(specs: list[dict], username: str) -> str:
    return next(u["password"] for u in specs if u["username"] == username)


def _airflow_secret(paths: Paths) -> str:
    """One secret per workdir for the API's JWTs and sessions, shared by all components."""
    f = paths.airflow_home / ".secret"
    if not f.exists():
        paths.airflow_home.mkdir(parents=True, exist_ok=True)
        from spark_jobs.platform.identity import write_secret_file

        write_secret_file(f, {"secret": secrets.token_urlsafe(32)})
    raw = f.read_text().strip()
    try:
        return str(json.loads(raw)["secret"])
    except (ValueError, KeyError, TypeError):  # a workdir from before: the bare secret
        return raw


def airflow_env(
    args: argparse.Namespace, bootstrap: str, paths: Paths, project_root: Path = PROJECT_ROOT
) -> dict[str, str]:
    """Airflow 3.3 settings for the embedded platform (names from its config reference).

    The execution API URL must follow the port: task processes call it, and its default
    assumes http://localhost:8080.
    """
    home = paths.airflow_home
    env = {
        **base_env(bootstrap, paths, not args.insecure),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(project_root / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(project_root / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
        "AIRFLOW__CORE__AUTH_MANAGER": AUTH_MANAGER,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__SECRETS__BACKEND": "airflow.secrets.local_filesystem.LocalFilesystemBackend",
        "AIRFLOW__SECRETS__BACKEND_KWARGS": json.dumps({"connections_file_path": str(paths.connections_file)}),
        "AIRFLOW__API__HOST": args.airflow_host,
        "AIRFLOW__API__PORT": str(args.airflow_port),
        "AIRFLOW__API__WORKERS": "1",  # 2-core machines: one API worker is plenty
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{airflow_url(args)}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": _airflow_secret(paths),
        "AIRFLOW__API__SECRET_KEY": _airflow_secret(paths),
        "GX_ANALYTICS_ENABLED": "False",
        "RULE_LIFECYCLE_BOOTSTRAP": bootstrap,
        "PYTHONPATH": str(project_root)
        + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
    }
    from spark_jobs.platform.control import airflow_connection_env

    if args.insecure:  # with credentials they are in the 0600 connections file instead
        env.update(airflow_connection_env(bootstrap))  # detection_supervisor's Kafka connections
    if args.airflow_db:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = args.airflow_db
    elif "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" not in os.environ:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home / 'airflow.db'}"
    return env


AIRFLOW_COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


def airflow_specs(
    args: argparse.Namespace,
    bootstrap: str,
    paths: Paths,
    binary: str,
    on_ready: Callable[[], None] | None = None,
) -> list[ChildSpec]:
    """Airflow's components as separate children (what `airflow standalone` runs, but
    with the FAB auth manager that standalone would replace)."""
    url = airflow_url(args)
    env = airflow_env(args, bootstrap, paths)
    specs = []
    for component in AIRFLOW_COMPONENTS:
        api = component == "api-server"
        specs.append(
            ChildSpec(
                name=f"airflow-{component}",
                argv=[binary, component],
                env=env,
                cwd=paths.airflow_home,
                log_path=paths.logs / f"airflow-{component}.log",
                # The scheduler's LocalExecutor waits for its running tasks on the first
                # SIGTERM ("signal again if you don't want to wait"): a sensor poking or a
                # backtest held each Ctrl-C for the whole minute. The second signal comes
                # after 10 s; a task cut short is retried at the next start.
                stop_timeout=10.0 if component == "scheduler" else 60.0,
                # The scheduler, DAG processor and triggerer stop together, the api-server
                # after them: a task the scheduler cuts short still reports its end (up
                # for retry) through the Execution API, instead of staying "running"
                # until a heartbeat timeout after the next start.
                stop_group="airflow-api" if api else "airflow",
                ready=(lambda: _http_ok(f"{url}/api/v2/monitor/health")) if api else None,
                ready_message=f"Airflow UI ready: {url}" if api else None,
                on_ready=on_ready if api else None,
            )
        )
    return specs


def prepare_airflow(env: dict[str, str], binary: str, users_file: Path, log: Path) -> None:
    """Migrate the metadata DB and provision the roles and demo users, before any
    Airflow component starts (output to `log`: it would otherwise show on the terminal)."""
    import subprocess

    log.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [binary, "db", "migrate"],
        [sys.executable, "-m", "spark_jobs.platform.identity", str(users_file)],
    ]
    with log.open("a", encoding="utf-8") as out:
        for argv in steps:
            proc = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=env["AIRFLOW_HOME"])
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(argv[:4])} failed (exit {proc.returncode}); see {log}")


def unpause_platform_dags(
    url: str,
    user: str,
    password: str,
    dags_folder: Path,
    marker: Path,
    say: Callable[[str], None],
    deadline_s: float = 300.0,
) -> None:
    """On the first start of a workdir, unpause the DAGs of this repository's dags/.

    The platform's DAGs (release, detection supervisor, reports) are meant to run from
    the start. Letting Airflow create them unpaused races its API server on a first
    start: the scheduler launches a task before the execution API listens, and the run
    fails. So they are created paused (Airflow's default) and unpaused here, once the API
    answers. Only once per workdir (`marker`): a DAG the user paused later stays paused.
    """
    if marker.exists():
        return
    api = _patient(_api)
    token = _patient(_api_token)(url, user, password)
    expected = {f.name for f in dags_folder.glob("*.py") if not f.name.startswith("_")}
    seen_files: set[str] = set()
    unpaused: list[str] = []
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        dags = api(url, token, "GET", "/api/v2/dags?limit=500").get("dags", [])
        for dag in dags:
            fileloc = Path(dag.get("fileloc") or "")
            if fileloc.parent != dags_folder:
                continue
            seen_files.add(fileloc.name)
            if dag.get("is_paused") and dag["dag_id"] not in unpaused:
                api(url, token, "PATCH", f"/api/v2/dags/{dag['dag_id']}", {"is_paused": False})
                unpaused.append(dag["dag_id"])
        if expected <= seen_files:
            break
        time.sleep(5.0)
    marker.write_text(json.dumps({"unpaused": unpaused}) + "\n")
    if unpaused:
        say(f"Airflow: unpaused {', '.join(sorted(unpaused))} (first start of this workdir)")
    missing = sorted(expected - seen_files)
    if missing:
        say(f"Airflow: no DAG parsed yet from {', '.join(missing)} (import errors? see the UI)")


def _server_trouble(exc: BaseException) -> bool:
    """An answer worth asking again: a 5xx (on a first start the API server's writes
    can time out on a metadata DB that the scheduler and the DAG processor are busy
    writing: SQLite's lock, by default) or no connection."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code >= 500
    return isinstance(exc, urllib.error.URLError | ConnectionError | TimeoutError)


def _patient(call: Callable[..., T]) -> Callable[..., T]:
    """`call` asked again for up to two minutes while the server is in trouble."""
    return Retrying(retry=retry_if_exception(_server_trouble), stop=stop_after_delay(120),
                    wait=wait_exponential(multiplier=0.5, max=10), reraise=True).wraps(call)


def _api_token(url: str, user: str, password: str) -> str:
    body = json.dumps({"username": user, "password": password}).encode()
    req = urllib.request.Request(f"{url}/auth/token", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return str(json.loads(resp.read())["access_token"])


def _api(url: str, token: str, method: str, path: str, body: object = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    req = urllib.request.Request(f"{url}{path}", data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else {}


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.5) as resp:
            return 200 <= resp.status < 300
    except OSError:
        return False


def plan(
    args: argparse.Namespace,
    bootstrap: str,
    paths: Paths,
    airflow_bin: str | None,
    airflow_on_ready: Callable[[], None] | None = None,
) -> list[ChildSpec]:
    """The child processes, in start order (they are stopped in reverse)."""
    specs: list[ChildSpec] = []
    if not args.no_detect:
        specs.append(detect_spec(args, bootstrap, paths))
    if not args.no_archive:
        specs.append(archive_spec(args, bootstrap, paths))
    if not args.no_connect:
        specs.append(connect_spec(args, bootstrap, paths, args.connect_port))
    if not args.no_demo:
        specs.append(demo_spec(args, bootstrap, paths))
    if not args.no_airflow:
        if airflow_bin is None:
            raise ValueError(
                "airflow is not installed (pip install 'rule-platform[airflow]'), or use --no-airflow"
            )
        specs.extend(airflow_specs(args, bootstrap, paths, airflow_bin, airflow_on_ready))
    return specs


def run(args: argparse.Namespace) -> int:
    from spark_jobs.kafka.broker import PLATFORM_TOPICS, EmbeddedBroker
    from spark_jobs.kafka.client_config import CREDENTIALS_ENV
    from spark_jobs.kafka.security import BrokerSecurity

    host = "127.0.0.1"
    bootstrap = f"{host}:{args.port}"
    paths = Paths(Path(args.workdir).resolve())
    problems = _preflight(args, host)
    if problems:
        for p in problems:
            print(f"rulectl up: {p}", file=sys.stderr)
        return 2
    paths.logs.mkdir(parents=True, exist_ok=True)
    # The broker keeps its log in the work folder, so the job's checkpoint stays valid
    # across runs and resumes where it stopped. A checkpoint without the broker log it
    # was written against (the log deleted by hand) would be offsets into nothing: the
    # job would stop with a data-loss error, so such a checkpoint is set aside.
    if not paths.kafka_dir.exists() and paths.detect_dir.exists():
        shutil.move(str(paths.detect_dir), str(paths.workdir / f"detect.orphaned.{int(time.time())}"))
    # The same for the archive's checkpoint; its table (the history) is kept.
    if not paths.kafka_dir.exists() and paths.archive_checkpoint.exists():
        shutil.move(str(paths.archive_checkpoint), str(paths.archive_dir / f"checkpoint.orphaned.{int(time.time())}"))
    paths.detect_dir.mkdir(parents=True, exist_ok=True)
    from spark_jobs.kafka import signing

    signing.ensure_key_file(paths.signing_key_file)
    os.environ[signing.KEY_FILE_ENV] = str(paths.signing_key_file)  # this process publishes at start
    security = None
    os.environ.pop("KAFKA_PRINCIPAL", None)
    if args.insecure:
        os.environ.pop(CREDENTIALS_ENV, None)
    else:
        # Generated once per workdir (0600), kept: the broker's log stores these users.
        security = BrokerSecurity.load_or_generate(paths.kafka_credentials_file)
        os.environ[CREDENTIALS_ENV] = str(paths.kafka_credentials_file)  # publishes at start as `publisher`
    sup = Supervisor(on_change=lambda s: _write_state(s, paths, bootstrap, args))
    try:
        users = demo_users(paths) if not args.no_airflow else None
        if users is not None:
            write_connections(paths, args, users)
        on_ready = None
        if users is not None:
            url = airflow_url(args)
            marker = paths.airflow_home / ".platform_dags_unpaused"
            dags_folder = PROJECT_ROOT / "dags"
            op_password = user_password(users, "operator")
            on_ready = lambda: unpause_platform_dags(  # noqa: E731
                url, "operator", op_password, dags_folder, marker, sup.say
            )
        specs = plan(args, bootstrap, paths, airflow_binary(), on_ready)
    except ValueError as exc:
        print(f"rulectl up: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()
    previous = _install_handlers(stop, sup)
    try:
        broker = EmbeddedBroker(
            port=args.port,
            host=host,
            topics=PLATFORM_TOPICS,
            partitions=args.partitions,
            log_path=paths.logs / "broker.log",
            data_dir=paths.kafka_dir,
            security=security,
        )
        sup.say(f"starting broker on {bootstrap} ...")
        sup.start(BrokerComponent(broker))
        n_rules = _publish(args.rules, bootstrap, sup, paths)
        if n_rules is None:
            return 1
        airflow_bin = airflow_binary()
        if users is not None and airflow_bin is not None and not stop.is_set():
            sup.say("preparing Airflow: metadata DB, roles, demo users ...")
            prepare_airflow(airflow_env(args, bootstrap, paths), airflow_bin, paths.users_file, paths.logs / "airflow-init.log")
        for spec in specs:
            if stop.is_set():
                break
            child = sup.start_child(spec)
            sup.say(f"started {spec.name} (pid {child.pid}, log {spec.log_path})")
            if spec.name == "airflow-api-server":
                # The scheduler hands tasks to the execution API of this server: started
                # before it listens (the DAGs are unpaused from the second start on), the
                # first tasks of every DAG would fail, a red run per DAG per start.
                await_ready(spec, child, stop, timeout_s=300.0)
        if not stop.is_set():
            _banner(sup, args, bootstrap, paths, n_rules, users, PLATFORM_TOPICS)
        return sup.run(stop)
    except Exception as exc:  # noqa: BLE001 - report, then stop what was started
        print(f"rulectl up: {exc}", file=sys.stderr)
        return 1
    finally:
        sup.stop_all()
        _restore_handlers(previous)
        sup.say("platform stopped")


def await_ready(spec: ChildSpec, child: ChildProcess, stop: threading.Event, timeout_s: float) -> None:
    """Block until `spec.ready()` holds; raise if the child exits or the time runs out."""
    assert spec.ready is not None
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        if child.poll() is not None:
            raise RuntimeError(f"{spec.name} exited while starting; see {spec.log_path}")
        if spec.ready():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{spec.name} not ready after {timeout_s:g}s; see {spec.log_path}")
        stop.wait(1.0)


def _preflight(args: argparse.Namespace, host: str) -> list[str]:
    """What would make the start fail half-way, checked before anything starts."""
    from spark_jobs.kafka.broker import port_in_use

    problems = []
    if port_in_use(host, args.port):
        problems.append(f"port {args.port} is in use (another broker? use --port)")
    if not args.no_airflow and port_in_use("127.0.0.1", args.airflow_port):
        problems.append(
            f"port {args.airflow_port} is in use (another Airflow? use --airflow-port or --no-airflow)"
        )
    if not args.no_connect and port_in_use("127.0.0.1", args.connect_port):
        problems.append(f"port {args.connect_port} is in use (another Spark Connect server? use --connect-port "
                        "or --no-connect)")
    if args.partitions < 1:
        problems.append("--partitions must be at least 1")
    if args.demo_rate <= 0:
        problems.append("--demo-rate must be positive")
    if not Path(args.rules).exists():
        problems.append(f"rules directory not found: {args.rules}")
    return problems


def _publish(rules_dir: str, bootstrap: str, sup: Supervisor, paths: Paths) -> int | None:
    """Bootstrap an empty rules.active, else publish nothing (spark_jobs.lifecycle.bootstrap):
    the only other way onto the topic is an approved release. Returns the number of live
    rules, or None when an empty topic cannot be bootstrapped (invalid rules)."""
    from spark_jobs.kafka.publisher import current_rules, publish_rules
    from spark_jobs.lifecycle.bootstrap import start_rules
    from spark_jobs.lifecycle.settings import LifecycleSettings

    def publish(rules: list, commit: str | None) -> dict[str, tuple[int, int]]:
        return publish_rules(rules, bootstrap, published_by="rulectl up (bootstrap)", commit=commit).offsets

    outcome = start_rules(
        Path(rules_dir), audit_dir(paths), lambda: current_rules(bootstrap), publish, branch=LifecycleSettings().branch
    )
    for line in outcome.lines(rules_dir):
        sup.say(line)
    if outcome.bootstrapped and outcome.errors:
        sup.say("rulectl up: rules.active is empty and its bootstrap is invalid: stopping")
        return None
    return outcome.live_count


def audit_dir(paths: Paths) -> Path:
    """The release audit of this work folder (the release DAG's, under Airflow's home)."""
    return paths.airflow_home / "rule_lifecycle" / "audit"


def _banner(
    sup: Supervisor,
    args: argparse.Namespace,
    bootstrap: str,
    paths: Paths,
    n_rules: int,
    users: list[dict] | None,
    topics: tuple[str, ...],
) -> None:
    procs = sup.describe()
    lines = [
        "",
        "=" * 78,
        f"rule platform is up (workdir {paths.workdir})",
        f"  Kafka      {bootstrap} (log in {paths.kafka_dir})  topics: {', '.join(topics)}",
        ("             INSECURE: no SASL users, no ACLs (--insecure: development only)" if args.insecure else
         f"             SASL/SCRAM + ACLs; principals' passwords in {paths.kafka_credentials_file} "
         "(readable by you only)"),
        f"  rules      {n_rules} live on rules.active; changes to {args.rules} go live through a release",
    ]
    if "detect" in procs:
        lines.append(
            f"  detection  rulectl detect, pid {procs['detect']['pid']}, restarted if it exits; log {paths.logs / 'detect.log'}"
        )
        lines.append(f"             checkpoint {paths.checkpoint}, status {paths.status_file}")
    if "archive" in procs:
        lines.append(
            f"  archive    rulectl archive, pid {procs['archive']['pid']}: events into {paths.archive_table} (Delta); "
            f"log {paths.logs / 'archive.log'}"
        )
    if "connect" in procs:
        lines.append(
            f"  backtests  Spark Connect on sc://127.0.0.1:{args.connect_port}: rulectl backtest --remote "
            f"sc://127.0.0.1:{args.connect_port} --history {paths.archive_table} --from -1h ..."
        )
    if "demo" in procs:
        lines.append(
            f"  demo       {args.demo_rate:g} events/s + a seed pattern every 10 s; log {paths.logs / 'demo.log'}"
        )
    if "airflow-api-server" in procs and users:
        from spark_jobs.lifecycle.settings import LifecycleSettings, env_settings

        tracked = LifecycleSettings.from_dict(env_settings())
        poll = os.environ.get("RULE_RELEASE_POLL_MINUTES", "5")
        lines.append(f"  Airflow    {airflow_url(args)}  (starting, ~1 min); home {paths.airflow_home}, logs {paths.logs}/airflow-*.log")
        who = ", ".join(f"{u['username']} ({u['roles'][0]})" for u in users if u["username"] in DEMO_USERS)
        lines.append(f"             users: {who}")
        lines.append(f"             passwords in {paths.users_file} (readable by you only)")
        lines.append(
            f"  releases   rule_release tracks {tracked.repo} branch {tracked.branch} ({tracked.rules_dir}/), "
            f"polling every {poll} min; the Airflow Variable rule_lifecycle (\"repo\", \"branch\") changes it"
        )
    lines += [
        f"  state      {paths.state_file} (pids, logs; SIGTERM the detect pid to restart the job)",
        "watch detections:    " + watch_command(args, paths, bootstrap, "events.processed"),
        "watch dead letters:  " + watch_command(args, paths, bootstrap, "events.deadletter"),
        "Ctrl-C stops everything (twice: without waiting).",
        "=" * 78,
    ]
    sup.say("\n".join(lines))


def watch_command(args: argparse.Namespace, paths: Paths, bootstrap: str, topic: str) -> str:
    """A `rulectl tail` that works pasted into any shell: the rulectl of this environment
    by its path (the virtualenv need not be active), the credentials file named (not a
    password), the port when it is not the default."""
    import shlex

    local = Path(sys.executable).parent / "rulectl"
    cmd = [str(local)] if local.exists() else [sys.executable, "-m", "spark_jobs.cli"]
    cmd += ["tail", topic]
    if bootstrap != "127.0.0.1:9092":
        cmd += ["--bootstrap", bootstrap]
    env = "" if args.insecure else f"KAFKA_CREDENTIALS_FILE={shlex.quote(str(paths.kafka_credentials_file))} "
    return env + shlex.join(cmd)


def _write_state(sup: Supervisor, paths: Paths, bootstrap: str, args: argparse.Namespace) -> None:
    """platform.json: what runs where, for people and for the detection supervisor DAG."""
    state = {
        "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "supervisor_pid": os.getpid(),
        "bootstrap": bootstrap,
        "workdir": str(paths.workdir),
        "detect": {
            "checkpoint": str(paths.checkpoint),
            "status_file": str(paths.status_file),
            "restart": "send SIGTERM to components.detect.pid: rulectl up restarts it from its checkpoint",
        },
        "archive": {"table": str(paths.archive_table), "checkpoint": str(paths.archive_checkpoint),
                    "status_file": str(paths.archive_status_file)},
        "airflow_url": None if args.no_airflow else airflow_url(args),
        # How `rulectl` in the user's shell finds its credentials (client_config).
        "kafka_credentials_file": None if args.insecure else str(paths.kafka_credentials_file),
        "components": sup.describe(),
        "history": sup.history[-50:],
    }
    tmp = paths.state_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(paths.state_file)


def _install_handlers(stop: threading.Event, sup: Supervisor) -> dict[int, object]:
    """First Ctrl-C/SIGTERM: stop gracefully. Second: stop without waiting."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            if not sup.force.is_set():
                sup.force.set()
                print("\nforcing shutdown", file=sys.stderr, flush=True)
            return
        stop.set()
        print("\nstopping the platform (Ctrl-C again to force) ...", file=sys.stderr, flush=True)

    return install_handlers(stop, handler)
