"""The daily DAGs wait for their next scheduled time on a platform's first start.

Airflow runs the latest past time of a `catchup=False` DAG at once when it has a
`start_date`: every first `rulectl up` then maintained and reported on an archive
that was seconds old, beside the first release's backtests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dag_import import import_dag

FIRST_RUN = (
    "'first': (lambda i: i and i.run_after.isoformat())(d.timetable.next_dagrun_info("
    "last_automated_data_interval=None, restriction=__import__('airflow.timetables.base', fromlist=['x'])"
    ".TimeRestriction(d.start_date, None, d.catchup)))"
)


@pytest.mark.parametrize("dag_id", ["archive_maintenance", "backtest_report"])
def test_first_run_of_a_daily_dag_is_the_next_midnight(tmp_path: Path, dag_id: str) -> None:
    before = datetime.now(UTC)
    out = import_dag(tmp_path, dag_id, FIRST_RUN)
    after = datetime.now(UTC)
    assert out["errors"] == {}
    first = datetime.fromisoformat(out["first"])
    midnights = {(t + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0) for t in (before, after)}
    assert first in midnights, (first, before)
