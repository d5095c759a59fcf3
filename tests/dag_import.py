"""Import one DAG file the way Airflow's DAG processor does (DagBag), in a subprocess
with a throwaway AIRFLOW_HOME and SQLite, so no test's Airflow settings leak in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_dag(tmp_path: Path, dag_id: str, fields: str = "", drop_env: tuple[str, ...] = (),
               timeout: float = 120) -> dict:
    """`{"errors": {file: error}, "tasks": {task_id: [downstream ids]} | None, <fields>}`
    of `dags/<dag_id>.py`; `fields` adds JSON members computed from `d`, the DAG (or
    None), as Python source, e.g. `"'catchup': d and d.catchup"`."""
    script = (
        "import json\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(ROOT / 'dags' / f'{dag_id}.py')!r})\n"
        f"d = bag.dags.get({dag_id!r})\n"
        "print(json.dumps({'errors': {k: str(v) for k, v in bag.import_errors.items()},\n"
        "  'tasks': {t.task_id: sorted(t.downstream_task_ids) for t in d.tasks} if d else None,\n"
        f"  {fields}}}))\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__", *drop_env))},
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/a.db",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
    }
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
