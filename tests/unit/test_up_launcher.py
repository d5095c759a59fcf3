"""`rulectl up`: argument parsing, the process plan, and the supervisor's process handling.

The supervisor is exercised with short-lived dummy children (small Python scripts), so
the checks are about real processes and signals: reverse stop order, each child's own
graceful signal, restart of the child whose policy says so, and stopping everything when
one that must not die does.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from spark_jobs.cli import build_parser
from spark_jobs.commands import up
from spark_jobs.platform.launcher import ChildSpec, RestartPolicy, Supervisor

# A dummy child: records the signal it gets in `log`, then exits 0 (or `code`).
DUMMY = r"""
import signal, sys, time
name, log, code = sys.argv[1], sys.argv[2], int(sys.argv[3])
def stop(signum, frame):
    with open(log, "a") as f:
        f.write(f"{name}:{signal.Signals(signum).name}\n")
    sys.exit(code)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
with open(log, "a") as f:
    f.write(f"{name}:started\n")
while True:
    time.sleep(0.05)
"""


def dummy(tmp_path: Path, name: str, log: Path, *, code: int = 0, **kw) -> ChildSpec:
    # Written once: rewriting it for a second child could truncate the file while the
    # first child's interpreter reads it (it then runs nothing and never says "started").
    script = tmp_path / "dummy.py"
    if not script.exists():
        tmp = tmp_path / ".dummy.py.tmp"
        tmp.write_text(DUMMY)
        tmp.replace(script)
    return ChildSpec(name=name, argv=[sys.executable, str(script), name, str(log), str(code)], **kw)


def wait_for(predicate, timeout: float = 60.0) -> None:
    """Polls `predicate`; the timeout is generous because the CI machine runs this beside
    JVMs that keep both cores busy, where starting a Python child takes seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def started(log: Path, *names: str) -> bool:
    text = log.read_text() if log.exists() else ""
    return all(f"{n}:started" in text for n in names)


# ----------------------------------------------------------------------------- parsing


def test_up_arguments_parse_with_defaults_and_flags(tmp_path: Path) -> None:
    parser = build_parser()
    args = parser.parse_args(["up"])
    assert (args.port, args.airflow_port, args.workdir) == (9092, 8080, "var")
    assert not (args.no_airflow or args.no_demo or args.no_detect)
    assert args.func is up.run

    args = parser.parse_args(
        [
            "up",
            "--port",
            "19092",
            "--airflow-port",
            "18080",
            "--no-airflow",
            "--no-demo",
            "--workdir",
            str(tmp_path),
        ]
    )
    assert (args.port, args.airflow_port, args.no_airflow, args.no_demo) == (19092, 18080, True, True)
    assert args.workdir == str(tmp_path)


def test_plan_starts_detect_demo_airflow_in_that_order_with_workdir_paths(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["up", "--port", "19092", "--airflow-port", "18080", "--workdir", str(tmp_path)]
    )
    paths = up.Paths(tmp_path)
    specs = up.plan(args, "127.0.0.1:19092", paths, "/opt/bin/airflow")
    assert [s.name for s in specs] == [
        "detect", "archive", "connect", "demo", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
        "airflow-triggerer",
    ]
    detect, archive, connect, demo, airflow = specs[:5]
    # Stopped last first: the scheduler, DAG processor and triggerer together, and only
    # then the api-server, through which a task they cut short reports its end.
    groups = [s.stop_group for s in specs[4:]]
    assert groups[1] == groups[2] == groups[3] != groups[0]

    argv = list(detect.argv)
    assert argv[argv.index("--bootstrap") + 1] == "127.0.0.1:19092"
    assert Path(argv[argv.index("--checkpoint") + 1]).is_relative_to(tmp_path)
    assert Path(argv[argv.index("--status-file") + 1]).is_relative_to(tmp_path)
    assert argv[argv.index("--threshold-lane") + 1] == "real-time"  # sub-second threshold alerts
    assert detect.stop_signal == signal.SIGTERM  # the job's graceful stop
    paths.status_file.parent.mkdir(parents=True)
    paths.status_file.write_text("{}")  # a previous run's status must not count as "ready"
    assert detect.before_start is not None and detect.ready is not None
    detect.before_start()
    assert not detect.ready()
    assert detect.restart is not None  # the detection job is restarted, from its checkpoint

    # The event archive: supervised like the detection job, its table under the workdir,
    # which is where the lifecycle settings (Airflow's env) look for it.
    argv = list(archive.argv)
    assert argv[argv.index("archive") + 1:argv.index("archive") + 3] == ["--bootstrap", "127.0.0.1:19092"]
    assert argv[argv.index("--table") + 1] == str(tmp_path / "archive" / "events")
    assert Path(argv[argv.index("--checkpoint") + 1]).is_relative_to(tmp_path)
    assert archive.restart is not None and archive.stop_signal == signal.SIGTERM
    paths.archive_status_file.parent.mkdir(parents=True)
    paths.archive_status_file.write_text("{}")
    archive.before_start()
    assert not archive.ready()

    # A warm Spark for backtests (Spark Connect), restarted like the jobs.
    assert list(connect.argv)[-3:] == ["connect", "--port", "15002"] and connect.restart is not None

    assert "--forever" in demo.argv and demo.restart is None

    # Not `airflow standalone`: it would force the simple auth manager.
    assert [list(x.argv) for x in specs[4:]] == [
        ["/opt/bin/airflow", c] for c in ("api-server", "scheduler", "dag-processor", "triggerer")
    ]
    assert airflow.ready is not None and airflow.on_ready is None
    env = airflow.env or {}
    assert env["AIRFLOW_HOME"] == str(tmp_path / "airflow")
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(up.PROJECT_ROOT / "dags")
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(up.PROJECT_ROOT / "plugins")
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert env["AIRFLOW__API__PORT"] == "18080"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18080/execution/"
    # FAB's auth manager (a subclass adding role assignees for approvals).
    assert env["AIRFLOW__CORE__AUTH_MANAGER"] == "spark_jobs.platform.auth.RulePlatformAuthManager"
    from airflow.providers.fab.auth_manager.fab_auth_manager import FabAuthManager

    from spark_jobs.platform.auth import RulePlatformAuthManager

    assert issubclass(RulePlatformAuthManager, FabAuthManager)
    assert not any("SIMPLE_AUTH_MANAGER" in k for k in env)
    # Publisher (Airflow) and job share the rule-signing key file; nothing else of it is in the env.
    assert env["RULES_SIGNING_KEY_FILE"] == (detect.env or {})["RULES_SIGNING_KEY_FILE"] == str(tmp_path / "rules-signing.key")
    assert "RULES_SIGNING_KEY" not in env
    assert env["RULE_LIFECYCLE_BOOTSTRAP"] == "127.0.0.1:19092"
    assert env["RULES_ARCHIVE_TABLE"] == str(paths.archive_table)

    no_extras = build_parser().parse_args(["up", "--no-airflow", "--no-demo", "--no-archive", "--no-connect",
                                           "--workdir", str(tmp_path)])
    assert [s.name for s in up.plan(no_extras, "127.0.0.1:9092", paths, None)] == ["detect"]
    with pytest.raises(ValueError, match="airflow is not installed"):
        up.plan(build_parser().parse_args(["up"]), "127.0.0.1:9092", paths, None)


def test_demo_users_one_per_role_and_two_approvers_with_generated_passwords_in_an_owner_only_file(
        tmp_path: Path) -> None:
    paths = up.Paths(tmp_path)
    users = up.demo_users(paths)
    # Two approvers: a shadow's promotion takes one other than the shadow's.
    assert sorted(u["roles"][0] for u in users) == [
        "Platform operator", "Release service", "Rule approver", "Rule approver", "Rule author", "Rule viewer"]
    passwords = [u["password"] for u in users]
    assert len(set(passwords)) == 6 and all(len(p) >= 16 for p in passwords)
    assert not {"admin", "change-me", "airflow"} & set(passwords)
    f = tmp_path / "airflow" / "demo-users.json"
    assert f.stat().st_mode & 0o777 == 0o600
    assert up.demo_users(paths) == users  # kept across starts of the workdir
    f.chmod(0o644)
    up.demo_users(paths)
    assert f.stat().st_mode & 0o777 == 0o600  # re-tightened
    assert (tmp_path / "airflow").joinpath(".secret").exists() is False  # only written when Airflow starts


def test_the_banner_names_the_users_and_the_file_but_never_a_password(tmp_path: Path) -> None:
    paths = up.Paths(tmp_path)
    users = up.demo_users(paths)
    said: list[str] = []

    class FakeSupervisor:
        def describe(self) -> dict:
            return {"airflow-api-server": {"pid": 1}}

        def say(self, text: str) -> None:
            said.append(text)

    args = build_parser().parse_args(["up", "--workdir", str(tmp_path)])
    up._banner(FakeSupervisor(), args, "127.0.0.1:9092", paths, 3, users, ("rules.active",))  # type: ignore[arg-type]
    text = "\n".join(said)
    assert str(paths.users_file) in text
    for u in users:
        assert u["password"] not in text and u["password"][:8] not in text
    assert all(name in text for name in ("author", "approver", "viewer", "operator"))


def test_the_watch_command_names_this_rulectl_and_the_credentials_file(tmp_path: Path) -> None:
    import shlex

    paths = up.Paths(tmp_path / "my var")
    secure = build_parser().parse_args(["up", "--workdir", str(paths.workdir)])
    words = shlex.split(up.watch_command(secure, paths, "127.0.0.1:19092", "events.processed"))
    assert words[0] == f"KAFKA_CREDENTIALS_FILE={paths.kafka_credentials_file}"
    assert Path(words[1]).is_absolute() and Path(words[1]).name in ("rulectl", Path(sys.executable).name)
    assert words[-4:] == ["tail", "events.processed", "--bootstrap", "127.0.0.1:19092"]
    insecure = build_parser().parse_args(["up", "--insecure"])
    assert "KAFKA_CREDENTIALS_FILE" not in up.watch_command(insecure, paths, "127.0.0.1:9092", "events.processed")


def test_rulectl_finds_the_local_platforms_credentials_unless_told_otherwise(tmp_path: Path, monkeypatch) -> None:
    import json

    from spark_jobs.kafka import client_config

    creds = tmp_path / "var" / "kafka-credentials.json"
    creds.parent.mkdir()
    creds.write_text("{}")
    (tmp_path / "var" / "platform.json").write_text(json.dumps({"kafka_credentials_file": str(creds)}))
    monkeypatch.chdir(tmp_path)
    # Set, then removed: monkeypatch then restores the variable as it was before this test,
    # whatever adopt_platform_credentials writes into os.environ (later tests of the
    # worker must not inherit a credentials file).
    for name in (client_config.CREDENTIALS_ENV, client_config.PLATFORM_STATE_ENV):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert client_config.adopt_platform_credentials() == str(creds)
    assert os.environ[client_config.CREDENTIALS_ENV] == str(creds)
    monkeypatch.setenv(client_config.CREDENTIALS_ENV, "/elsewhere.json")  # an explicit setting wins
    assert client_config.adopt_platform_credentials() is None and os.environ[client_config.CREDENTIALS_ENV] == "/elsewhere.json"
    monkeypatch.delenv(client_config.CREDENTIALS_ENV)
    (tmp_path / "var" / "platform.json").write_text(json.dumps({"kafka_credentials_file": None}))  # --insecure
    assert client_config.adopt_platform_credentials() is None and client_config.CREDENTIALS_ENV not in os.environ


# ----------------------------------------------------------------------------- supervision


def test_stop_all_stops_children_in_reverse_order_with_their_own_signal(tmp_path: Path) -> None:
    log = tmp_path / "signals.log"
    sup = Supervisor(out=io.StringIO(), poll_interval=0.05)
    sup.start_child(dummy(tmp_path, "first", log))
    sup.start_child(dummy(tmp_path, "second", log, stop_signal=signal.SIGINT))
    sup.start_child(dummy(tmp_path, "third", log))
    wait_for(lambda: started(log, "first", "second", "third"))

    sup.stop_all()
    stops = [line for line in log.read_text().splitlines() if not line.endswith(":started")]
    assert stops == ["third:SIGTERM", "second:SIGINT", "first:SIGTERM"]
    assert [h for h in sup.history if h.startswith("stop")] == ["stop third", "stop second", "stop first"]
    assert all(c.poll() is not None for c in sup.components)
    sup.stop_all()  # idempotent


def script(tmp_path: Path, name: str, source: str, out: Path, stop_timeout: float) -> ChildSpec:
    """A child running `source`, which writes to `out` (its argv[1]) once it is up."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return ChildSpec(name, [sys.executable, str(path), str(out)], stop_timeout=stop_timeout)


def test_a_child_that_ignores_its_signal_is_killed_after_its_timeout(tmp_path: Path) -> None:
    stubborn = (
        "import signal, time, sys\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(sys.argv[1], 'w').write('up')\n"
        "time.sleep(60)\n"
    )
    ready = tmp_path / "ready"
    sup = Supervisor(out=io.StringIO(), poll_interval=0.05)
    child = sup.start_child(script(tmp_path, "stubborn", stubborn, ready, stop_timeout=0.5))
    wait_for(ready.exists)
    t0 = time.monotonic()
    sup.stop_all()
    assert child.poll() is not None
    assert time.monotonic() - t0 < 10


def test_a_grandchild_in_a_session_of_its_own_is_stopped_with_its_child(tmp_path: Path) -> None:
    """What an Airflow task is to `airflow standalone`: started by the child, but in a
    session (process group) of its own, so signalling the child's group misses it."""
    parent = (
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        "open(sys.argv[1], 'w').write(str(g.pid))\n"
        "time.sleep(120)\n"
    )
    pid_file = tmp_path / "grandchild.pid"
    sup = Supervisor(out=io.StringIO(), poll_interval=0.05)
    sup.start_child(script(tmp_path, "parent", parent, pid_file, stop_timeout=2.0))
    wait_for(lambda: pid_file.exists() and pid_file.read_text() != "")
    grandchild = int(pid_file.read_text())
    assert os.getpgid(grandchild) == grandchild  # not in the child's group
    sup.stop_all()

    def gone() -> bool:
        # A zombie (exited, not yet reaped by init) is gone too.
        try:
            return psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    try:
        wait_for(gone, timeout=10.0)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)


def test_when_a_child_dies_the_platform_stops_in_reverse_order(tmp_path: Path) -> None:
    log = tmp_path / "signals.log"
    out = io.StringIO()
    sup = Supervisor(out=out, poll_interval=0.05)
    sup.start_child(dummy(tmp_path, "first", log))
    quitter = tmp_path / "quitter.py"
    quitter.write_text("import sys, time; time.sleep(0.3); print('bye'); sys.exit(3)\n")
    sup.start_child(ChildSpec("quitter", [sys.executable, str(quitter)], log_path=tmp_path / "quitter.log"))
    sup.start_child(dummy(tmp_path, "last", log))
    wait_for(lambda: started(log, "first", "last"))

    stop = threading.Event()
    assert sup.run(stop) == 1
    sup.stop_all()
    assert sup.failure == "quitter exited with code 3"
    assert "ERROR: quitter exited with code 3" in out.getvalue()
    assert "bye" in out.getvalue()  # the tail of its log is shown
    stops = [line for line in log.read_text().splitlines() if not line.endswith(":started")]
    assert stops == ["last:SIGTERM", "first:SIGTERM"]


def test_a_child_with_a_restart_policy_is_restarted_until_its_budget_is_used(tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    crasher = tmp_path / "crasher.py"
    crasher.write_text(f"open({str(counter)!r}, 'a').write('x'); raise SystemExit(2)\n")
    policy = RestartPolicy(max_restarts=2, window_s=60.0, backoff_s=0.01, max_backoff_s=0.05)
    out = io.StringIO()
    sup = Supervisor(out=out, poll_interval=0.05)
    sup.start_child(ChildSpec("detect", [sys.executable, str(crasher)], restart=policy))
    assert sup.run(threading.Event()) == 1
    sup.stop_all()
    assert counter.read_text() == "xxx"  # the first run and two restarts
    assert sup.history.count("restart detect") == 2
    assert "2 restarts in 60s used up" in (sup.failure or "")


def test_a_clean_exit_of_a_restartable_child_restarts_it_at_once(tmp_path: Path) -> None:
    """How a restart is requested: SIGTERM the detect pid, it exits 0, up restarts it."""
    log = tmp_path / "signals.log"
    sup = Supervisor(out=io.StringIO(), poll_interval=0.05)
    policy = RestartPolicy(max_restarts=3, window_s=60.0, backoff_s=5.0)
    child = sup.start_child(dummy(tmp_path, "detect", log, restart=policy))
    wait_for(lambda: started(log, "detect"))
    first_pid = child.pid
    assert first_pid is not None
    os.kill(first_pid, signal.SIGTERM)
    stop = threading.Event()
    runner = threading.Thread(target=sup.run, args=(stop,))
    runner.start()
    try:
        wait_for(lambda: "restart detect" in sup.history, timeout=3.0)  # no 5 s crash backoff
        wait_for(lambda: log.read_text().count("detect:started") == 2)
        assert child.pid != first_pid
    finally:
        stop.set()
        runner.join()
        sup.stop_all()
    assert child.poll() is not None


def test_readiness_is_reported_once(tmp_path: Path) -> None:
    log = tmp_path / "signals.log"
    out = io.StringIO()
    flag = tmp_path / "ready.flag"
    hook_calls: list[str] = []
    sup = Supervisor(out=out, poll_interval=0.05)
    sup.start_child(
        dummy(
            tmp_path,
            "svc",
            log,
            ready=flag.exists,
            ready_message="svc is up",
            on_ready=lambda: hook_calls.append("called"),
        )
    )
    wait_for(lambda: started(log, "svc"))
    assert sup.check() is None and "svc is up" not in out.getvalue()
    flag.write_text("")
    time.sleep(0.01)
    for w in sup._watches:  # skip the 2 s between probes
        w.next_ready_check = 0.0
    assert sup.check() is None
    wait_for(lambda: hook_calls == ["called"])
    for w in sup._watches:
        w.next_ready_check = 0.0
    sup.check()
    sup.stop_all()
    assert out.getvalue().count("svc is up") == 1
    assert hook_calls == ["called"]


# ----------------------------------------------------------------------------- Kafka security


def test_every_child_authenticates_through_the_credentials_file_and_insecure_is_explicit(tmp_path: Path) -> None:
    """Security is the default: children get the file's path (never a password), the
    supervisor's Kafka connections carry SASL settings in the 0600 connections file, not
    in an environment; `--insecure` removes all of it."""
    import json

    from spark_jobs.kafka.client_config import CREDENTIALS_ENV
    from spark_jobs.kafka.security import BrokerSecurity

    paths = up.Paths(tmp_path)
    args = build_parser().parse_args(["up", "--port", "19092", "--workdir", str(tmp_path)])
    assert not args.insecure
    security = BrokerSecurity.load_or_generate(paths.kafka_credentials_file)
    assert paths.kafka_credentials_file.stat().st_mode & 0o777 == 0o600
    assert BrokerSecurity.load_or_generate(paths.kafka_credentials_file).passwords == security.passwords  # kept
    specs = up.plan(args, "127.0.0.1:19092", paths, "/opt/bin/airflow")
    for spec in specs:
        env = spec.env or {}
        assert env[CREDENTIALS_ENV] == str(paths.kafka_credentials_file), spec.name
        assert "KAFKA_PRINCIPAL" not in env
        assert not any(pw in " ".join(map(str, [*spec.argv, *env.values()])) for pw in security.passwords.values())
        assert not any(k.startswith("AIRFLOW_CONN_DETECT") for k in env), spec.name
    users = up.demo_users(paths)
    conns = json.loads(up.write_connections(paths, args, users).read_text())
    assert paths.connections_file.stat().st_mode & 0o777 == 0o600
    for cid in ("detect_kafka", "detect_kafka_producer"):
        extra = conns[cid]["extra"]
        assert extra["bootstrap.servers"] == "127.0.0.1:19092"
        assert (extra["security.protocol"], extra["sasl.mechanism"]) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")
        assert (extra["sasl.username"], extra["sasl.password"]) == ("supervisor", security.passwords["supervisor"])

    insecure = build_parser().parse_args(["up", "--insecure", "--workdir", str(tmp_path / "dev")])
    dev = up.Paths(tmp_path / "dev")
    for spec in up.plan(insecure, "127.0.0.1:9092", dev, "/opt/bin/airflow"):
        assert CREDENTIALS_ENV not in (spec.env or {}), spec.name
    assert "AIRFLOW_CONN_DETECT_KAFKA" in (up.airflow_env(insecure, "127.0.0.1:9092", dev))
    assert "detect_kafka" not in json.loads(up.write_connections(dev, insecure, up.demo_users(dev)).read_text())


def test_client_config_is_the_one_place_settings_become_sasl(tmp_path: Path, monkeypatch) -> None:
    from spark_jobs.kafka import client_config as cc

    monkeypatch.delenv(cc.CREDENTIALS_ENV, raising=False)
    monkeypatch.delenv("KAFKA_PRINCIPAL", raising=False)
    assert cc.confluent_config("detector") == {} and cc.spark_options("detector") == {}  # plaintext broker
    creds = tmp_path / "creds.json"
    creds.write_text('{"detector": "d-pw", "reader": "r\\"pw"}')
    monkeypatch.setenv(cc.CREDENTIALS_ENV, str(creds))
    assert cc.confluent_config("detector") == {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                                               "sasl.username": "detector", "sasl.password": "d-pw"}
    opts = cc.spark_options("reader")
    assert opts["kafka.security.protocol"] == "SASL_PLAINTEXT" and opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    # A quote in a password cannot end the JAAS value.
    assert opts["kafka.sasl.jaas.config"].endswith('username="reader" password="r\\"pw";')
    with pytest.raises(cc.KafkaAuthError, match="publisher"):
        cc.confluent_config("publisher")  # not in this host's file: an error, not an anonymous client
    monkeypatch.setenv("KAFKA_PRINCIPAL", "reader")  # one identity for the whole process
    assert cc.confluent_config("detector")["sasl.username"] == "reader"


def test_the_scheduler_waits_for_the_api_server_to_answer(tmp_path: Path) -> None:
    """From the second start on the DAGs are unpaused: a scheduler started before the
    execution API listens fails the first task of every DAG."""
    calls = {"n": 0}

    def ready() -> bool:
        calls["n"] += 1
        return calls["n"] >= 3

    class Child:
        def poll(self) -> int | None:
            return None

    spec = ChildSpec(name="airflow-api-server", argv=["x"], env={}, cwd=tmp_path, log_path=tmp_path / "a.log", ready=ready)
    started = time.monotonic()
    up.await_ready(spec, Child(), threading.Event(), timeout_s=30)  # type: ignore[arg-type]
    assert calls["n"] == 3 and time.monotonic() - started >= 1.5

    class Dead(Child):
        def poll(self) -> int | None:
            return 1

    with pytest.raises(RuntimeError, match="exited while starting"):
        up.await_ready(spec, Dead(), threading.Event(), timeout_s=30)  # type: ignore[arg-type]
    never = ChildSpec(name="airflow-api-server", argv=["x"], env={}, cwd=tmp_path, log_path=tmp_path / "a.log",
                      ready=lambda: False)
    with pytest.raises(RuntimeError, match="not ready after"):
        up.await_ready(never, Child(), threading.Event(), timeout_s=1.5)  # type: ignore[arg-type]


def test_neighbours_of_one_stop_group_are_stopped_together(tmp_path: Path) -> None:
    """Airflow's components stop at once: each takes 3 s after its signal here, so one
    after the other the second would get its signal 3 s after the first."""
    slow = (
        "import signal, sys, time\n"
        "out = sys.argv[1]\n"
        "def stop(signum, frame):\n"
        "    open(out + '.signalled', 'w').write(repr(time.time()))\n"
        "    time.sleep(3)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "open(out, 'w').write('up')\n"
        "while True:\n"
        "    time.sleep(0.05)\n"
    )
    log = tmp_path / "signals.log"
    sup = Supervisor(out=io.StringIO(), poll_interval=0.05)
    sup.start_child(dummy(tmp_path, "alone", log))
    outs = [tmp_path / "a", tmp_path / "b"]
    for name, out in zip(("a", "b"), outs, strict=True):
        spec = script(tmp_path, name, slow, out, stop_timeout=20)
        spec.stop_group = "g"
        sup.start_child(spec)
    wait_for(lambda: started(log, "alone") and all(o.exists() for o in outs))
    sup.stop_all()
    a, b = (float(Path(f"{o}.signalled").read_text()) for o in outs)
    assert abs(a - b) < 2.0, (a, b)
    # The group stops before the child started before it, as the reverse order wants.
    assert [h for h in sup.history if h.startswith("stop")][-1] == "stop alone"
