"""Task defaults shared by the platform's DAGs.

One retry, soon: a task that was running when its worker went away (Ctrl-C on `rulectl
up`, a worker host restarted) is failed by the scheduler once it is back, which would
turn a healthy run red at every restart. With a retry the task simply runs again.
Failures a retry cannot mend raise AirflowFailException, which skips the retry (invalid
rules, a crash-looping job, params outside the allow-list).
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.timetables.trigger import CronTriggerTimetable

TASK_DEFAULTS: dict[str, object] = {"retries": 1, "retry_delay": timedelta(seconds=30)}


def periodic(env_var: str, default: str) -> CronTriggerTimetable:
    """The cron schedule in `env_var` (else `default`), UTC, whose first run is its next
    scheduled time, not the one that has just passed.

    For the daily jobs (archive maintenance, the backtest report): with a `start_date`
    and `catchup=False`, Airflow runs the latest past time at once, so the first start
    of a platform ran both over an archive that did not exist yet, beside the first
    release and its backtests. A user who wants a run now triggers one.

    `run_immediately=False` does not say that: Airflow then still runs the past time
    when it is less than a tenth of the period ago (2.4 hours for a daily job). A zero
    timedelta is "only when it is now".
    """
    return CronTriggerTimetable(os.environ.get(env_var, default), timezone="UTC", run_immediately=timedelta(0))
