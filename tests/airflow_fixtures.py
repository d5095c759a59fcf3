"""Fixtures and helpers for tests that run a real Airflow (and a real headless Chromium).

Airflow runs in subprocesses only: `airflow db migrate` on a dedicated PostgreSQL
database, a real `airflow api-server` (REST API, UI and our plugin), and
`airflow dags test` for DAG runs. The pytest process never imports Airflow, so its
configuration (AIRFLOW_HOME, database URL) cannot leak into other tests.

Environment (all optional):
- AIRFLOW_TEST_PG: PostgreSQL server URL without database
  (default postgresql+psycopg2://postgres@127.0.0.1:5432);
- AIRFLOW_TEST_DB: database name (default airflow_rules_test, + `_gwN` under pytest-xdist), dropped and recreated;
- CHROMIUM: the browser binary (default /usr/bin/chromium).

Import the fixtures in a test module: `from airflow_fixtures import airflow_env  # noqa: F401`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
AIRFLOW = str(VENV_BIN / "airflow")
PG_URL = os.environ.get("AIRFLOW_TEST_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432")
# One database per pytest-xdist worker: each worker drops and recreates its own.
DB_NAME = os.environ.get("AIRFLOW_TEST_DB", "airflow_rules_test") + (
    f"_{os.environ['PYTEST_XDIST_WORKER']}" if os.environ.get("PYTEST_XDIST_WORKER") else "")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# Real FAB users, one per platform role (spark_jobs/platform/identity.py). Rita authors
# the test commits (rita@example.com), so four eyes let Alice approve them but not Rita
# (were she an approver) nor anyone whose e-mail matches a commit of the release.
USER_SPECS = {
    "alice": ("Rule approver", "alice@example.com"),
    "rita": ("Rule author", "rita@example.com"),
    "bob": ("Rule viewer", "bob@example.com"),
    "oscar": ("Platform operator", "oscar@example.com"),
    "carol": ("Rule approver", "carol@example.com"),
    "release-service": ("Release service", "release-service@rules.invalid"),
}
USERS = {name: f"{name}-test-pw-{len(name)}x" for name in USER_SPECS}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _admin_sql(sql: str) -> None:
    """Run one statement on the server's `postgres` database (autocommit)."""
    import psycopg2

    parsed = urllib.parse.urlparse(PG_URL.replace("postgresql+psycopg2", "postgresql"))
    conn = psycopg2.connect(
        host=parsed.hostname or "127.0.0.1",
        port=parsed.port or 5432,
        user=parsed.username or "postgres",
        password=parsed.password,
        dbname="postgres",
    )
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


@dataclass
class AirflowEnv:
    """A migrated Airflow home with a running api-server."""

    home: Path
    env: dict[str, str]
    base_url: str
    api_log: Path
    _tokens: dict[str, str] = field(default_factory=dict)
    runs: list = field(default_factory=list)

    # ---- REST API (what the UI calls) -------------------------------------------------
    def token(self, user: str = "alice") -> str:
        if user not in self._tokens:
            body = json.dumps({"username": user, "password": USERS[user]}).encode()
            req = urllib.request.Request(
                f"{self.base_url}/auth/token", data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=30) as resp:
                self._tokens[user] = json.loads(resp.read())["access_token"]
        return self._tokens[user]

    def request(self, method: str, path: str, body: object = None, user: str = "oscar") -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.base_url}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token(user)}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def api(self, method: str, path: str, body: object = None, user: str = "oscar") -> dict:
        status, raw = self.request(method, f"/api/v2{path}", body, user)
        if status >= 400:
            raise AssertionError(f"{method} {path} -> {status}: {raw[:500]!r}")
        return json.loads(raw) if raw else {}

    # ---- CLI -----------------------------------------------------------------------------
    def cli(self, *args: str, timeout: float = 600, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [AIRFLOW, *args],
            env={**self.env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=str(self.home),
        )

    def start_dag_test(self, dag_id: str, conf: dict | None = None, log_name: str = "dagtest") -> DagTestRun:
        """`airflow dags test DAG_ID -c CONF` in the background (it may wait for a human)."""
        log = self.home / f"{log_name}.log"
        args = [AIRFLOW, "dags", "test", dag_id]
        if conf is not None:
            args += ["-c", json.dumps(conf)]
        fh = log.open("w")
        proc = subprocess.Popen(args, env=self.env, stdout=fh, stderr=subprocess.STDOUT, cwd=str(self.home))
        run = DagTestRun(proc, log, fh)
        self.runs.append(run)
        return run

    def stop_runs(self) -> None:
        """Kill DAG test processes a failed test left waiting (e.g. for an approval)."""
        for run in self.runs:
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait(timeout=30)

    # ---- HITL ----------------------------------------------------------------------------
    def wait_for_hitl(self, dag_id: str, run: DagTestRun, timeout: float = 400) -> dict:
        """The pending human-in-the-loop request of the DAG's newest run."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            details = self.api("GET", f"/dags/{dag_id}/dagRuns/~/hitlDetails?response_received=false")
            pending = [d for d in details.get("hitl_details", []) if not d.get("response_received")]
            if pending:
                return pending[-1]
            if run.proc.poll() is not None:
                raise AssertionError(f"dag test ended (rc={run.proc.returncode}) without asking:\n{run.output()[-6000:]}")
            time.sleep(2)
        raise AssertionError(f"no approval request within {timeout}s:\n{run.output()[-6000:]}")

    def respond(self, detail: dict, option: str, comment: str = "", user: str = "alice") -> dict:
        ti = detail["task_instance"]
        path = (
            f"/dags/{ti['dag_id']}/dagRuns/{urllib.parse.quote(ti['dag_run_id'], safe='')}"
            f"/taskInstances/{ti['task_id']}/{ti.get('map_index', -1)}/hitlDetails"
        )
        return self.api("PATCH", path, {"chosen_options": [option], "params_input": {"comment": comment}}, user)

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}")

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        tis = self.api("GET", f"/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances")
        return {t["task_id"]: t["state"] for t in tis["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> object:
        path = f"/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/{task_id}/xcomEntries/{key}"
        return self.api("GET", path)["value"]

    def latest_run(self, dag_id: str) -> dict:
        runs = self.api("GET", f"/dags/{dag_id}/dagRuns?order_by=-run_after&limit=1")["dag_runs"]
        assert runs, f"no run of {dag_id}"
        return runs[0]


@dataclass
class DagTestRun:
    proc: subprocess.Popen
    log: Path
    _fh: object

    def wait(self, timeout: float = 400) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"dag test still running after {timeout}s:\n{self.output()[-6000:]}") from None
        self._fh.close()  # type: ignore[attr-defined]
        return rc

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _wait_http(url: str, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"api-server exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    raise RuntimeError(f"api-server not healthy after {timeout}s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def airflow_env():
    """Airflow 3 on PostgreSQL: fresh database, `db migrate`, a running api-server."""
    home = Path(tempfile.mkdtemp(prefix="airflow-home-"))
    try:
        _admin_sql(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        _admin_sql(f'CREATE DATABASE "{DB_NAME}"')
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"PostgreSQL not reachable at {PG_URL}: {exc}")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__", "RULE_LIFECYCLE_"))},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"{PG_URL}/{DB_NAME}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
        "AIRFLOW__CORE__AUTH_MANAGER": "spark_jobs.platform.auth.RulePlatformAuthManager",
        # The release DAG's API account (ends superseded runs).
        "AIRFLOW_CONN_RULE_LIFECYCLE_API": json.dumps({
            "conn_type": "http", "host": f"http://127.0.0.1:{port}", "login": "release-service",
            "password": USERS["release-service"],
        }),
        "AIRFLOW__API_AUTH__JWT_SECRET": "rule-lifecycle-tests-secret",
        "AIRFLOW__API__SECRET_KEY": "rule-lifecycle-tests-secret",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "PYSPARK_PYTHON": sys.executable,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "GX_ANALYTICS_ENABLED": "False",
        "RULE_RELEASE_POLL_MINUTES": "5",
        "PYTHONPATH": str(ROOT),
    }
    t0 = time.monotonic()
    mig = subprocess.run([AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True, timeout=300)
    if mig.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{mig.stdout[-3000:]}\n{mig.stderr[-3000:]}")
    users_file = home / "users.json"
    users_file.write_text(json.dumps([
        {"username": u, "roles": [role], "email": email, "first_name": u.title(), "last_name": "Test", "password": USERS[u]}
        for u, (role, email) in USER_SPECS.items()
    ]))
    users_file.chmod(0o600)
    prov = subprocess.run(
        [sys.executable, "-m", "spark_jobs.platform.identity", str(users_file)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    if prov.returncode != 0:
        raise RuntimeError(f"provisioning users failed:\n{prov.stdout[-3000:]}\n{prov.stderr[-3000:]}")
    api_log = home / "api-server.log"
    fh = api_log.open("w")
    proc = subprocess.Popen(
        [AIRFLOW, "api-server", "--port", str(port), "--host", "127.0.0.1"],
        env=env,
        stdout=fh,
        stderr=subprocess.STDOUT,
        cwd=str(home),
        start_new_session=True,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/v2/monitor/health", 120, proc, api_log)
        print(f"airflow ready in {time.monotonic() - t0:.1f}s (home {home})")
        af = AirflowEnv(home=home, env=env, base_url=f"http://127.0.0.1:{port}", api_log=api_log)
        try:
            yield af
        finally:
            af.stop_runs()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        fh.close()
        if not os.environ.get("KEEP_AIRFLOW_HOME"):
            shutil.rmtree(home, ignore_errors=True)


# ----------------------------------------------------------------------------- Chromium
# Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe):
# no websocket library and no driver binary needed, only Debian's `chromium`.

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--disable-dev-shm-usage",
]


def chromium_available() -> bool:
    return Path(CHROMIUM).exists()


class Chromium:
    """A headless Chromium and one page, controlled with CDP messages over fds 3/4."""

    def __init__(self, width: int = 1280, height: int = 900) -> None:
        self.profile = tempfile.mkdtemp(prefix="chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Move the child's ends above fd 4 so the shell redirections cannot clobber them.
        to_chrome_r, from_chrome_w = (self._high_fd(to_chrome_r), self._high_fd(from_chrome_w))
        # Chromium reads CDP from fd 3 and writes to fd 4: a shell places our pipe ends there.
        args = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe", "about:blank"]
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", f'exec "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}', "chromium", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(Path(self.profile) / "chromium.log", "wb"),  # noqa: SIM115 - lives with the process
            pass_fds=(to_chrome_r, from_chrome_w),
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable", session=True)
        self.send("Runtime.enable", session=True)
        self.send("Network.enable", session=True)
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=True,
        )

    @staticmethod
    def _high_fd(fd: int) -> int:
        import fcntl

        high = fcntl.fcntl(fd, fcntl.F_DUPFD, 5)
        os.close(fd)
        return high

    def _read_message(self, timeout: float) -> dict:
        import select

        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from chromium")
            ready, _, _ = select.select([self._from_chrome], [], [], left)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, *, session: bool = False, timeout: float = 60) -> dict:
        self._next_id += 1
        msg: dict = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read_message(timeout)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def set_cookie(self, url: str, name: str, value: str) -> None:
        self.send("Network.setCookie", {"url": url, "name": name, "value": value, "path": "/"}, session=True)

    def goto(self, url: str, timeout: float = 60) -> None:
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e.get("method") == "Page.loadEventFired" for e in self.events):
                return
            try:
                self.events.append(self._read_message(max(0.1, deadline - time.monotonic())))
            except TimeoutError:
                break
        raise TimeoutError(f"page did not load: {url}")

    def type_into(self, selector: str, text: str) -> None:
        """Focus an element and type into it (as keyboard input, not by setting .value)."""
        assert self.evaluate(f"(() => {{const e = document.querySelector({json.dumps(selector)}); if (!e) return false; e.focus(); return true}})()"), selector
        self.send("Input.insertText", {"text": text}, session=True)

    def click_button(self, label: str) -> bool:
        """Click the first visible, enabled button whose text is `label`; False if none."""
        return bool(self.evaluate(
            "(() => {const b = [...document.querySelectorAll('button,input[type=submit]')].find(x => "
            f"(x.innerText || x.value || '').trim() === {json.dumps(label)} && !x.disabled && x.offsetParent !== null);"
            " if (!b) return false; b.click(); return true})()"
        ))

    def login(self, base_url: str, username: str, password: str) -> None:
        """Sign in on Airflow's login page (FAB) like a person: type, click Sign In."""
        self.send("Network.clearBrowserCookies", session=True)
        self.goto(f"{base_url}/auth/login/")
        self.wait_for("!!document.querySelector('#username')")
        self.type_into("#username", username)
        self.type_into("#password", password)
        self.evaluate("document.querySelector('input[type=submit]').click()")
        self.wait_for("location.pathname === '/' || !location.pathname.startsWith('/auth/login')", timeout=30)

    def text(self) -> str:
        return str(self.evaluate("document.body ? document.body.innerText : ''") or "")

    def evaluate(self, expression: str) -> object:
        res = self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}, session=True
        )
        if "exceptionDetails" in res:
            raise RuntimeError(f"JS error: {res['exceptionDetails']}")
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> object:
        deadline = time.monotonic() + timeout
        value = None
        error: RuntimeError | None = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError as exc:
                # While a page loads `document.body` can be null: the expression throws
                # (a CI run failed so). Not yet, then; the last error is reported below.
                error, value = exc, None
            if value:
                return value
            time.sleep(0.5)
        raise TimeoutError(f"timed out waiting for: {expression} (last value {value!r}, last error {error})")

    def screenshot(self, path: Path, full_page: bool = True) -> bytes:
        params: dict = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics", session=True)["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 4000), "scale": 1}
            params["captureBeyondViewport"] = True
        data = base64.b64decode(self.send("Page.captureScreenshot", params, session=True)["data"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return data

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing anyway
            self.send("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        for fd in (self._to_chrome, self._from_chrome):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG header."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
