"""`rulectl up` unpauses the platform's DAGs on a first start even when the API server
answers a request with a 5xx (seen on `make up`: a PATCH timed out on SQLite's lock while
the scheduler and the DAG processor wrote, and two DAGs stayed paused)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from spark_jobs.commands.up import unpause_platform_dags


class _Airflow(BaseHTTPRequestHandler):
    dags: dict[str, bool] = {}
    folder = ""
    failures: dict[str, int] = {}

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: object) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _fail(self, what: str) -> bool:
        if self.failures.get(what, 0) > 0:
            self.failures[what] -= 1
            self._send(500, {"detail": "Internal Server Error"})
            return True
        return False

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        if not self._fail("token"):
            self._send(201, {"access_token": "t"})

    def do_GET(self) -> None:  # noqa: N802
        if not self._fail("list"):
            self._send(200, {"dags": [{"dag_id": d, "is_paused": p, "fileloc": f"{self.folder}/{d}.py"}
                                      for d, p in self.dags.items()]})

    def do_PATCH(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        dag = self.path.rsplit("/", 1)[1]
        if not self._fail(dag):
            self.dags[dag] = body["is_paused"]
            self._send(200, {"dag_id": dag, "is_paused": body["is_paused"]})


@pytest.fixture
def airflow(tmp_path: Path):
    folder = tmp_path / "dags"
    folder.mkdir()
    names = ("rule_release", "detection_supervisor", "backtest_report")
    for d in names:
        (folder / f"{d}.py").write_text("")
    _Airflow.dags = dict.fromkeys(names, True)
    _Airflow.folder = str(folder)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Airflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", folder
    server.shutdown()


def test_a_5xx_on_the_way_is_asked_again_and_every_dag_ends_unpaused(airflow, tmp_path: Path) -> None:
    url, folder = airflow
    _Airflow.failures = {"token": 1, "list": 1, "backtest_report": 2, "rule_release": 1}
    said: list[str] = []
    unpause_platform_dags(url, "admin", "pw", folder, tmp_path / "marker", said.append, deadline_s=60)
    assert _Airflow.dags == {"rule_release": False, "detection_supervisor": False, "backtest_report": False}
    assert json.loads((tmp_path / "marker").read_text())["unpaused"] == list(_Airflow.dags)
    assert said and "backtest_report" in said[0]
