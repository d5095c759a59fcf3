"""Task defaults shared by the platform's DAGs.

One retry, soon: a task that was running when its worker went away (Ctrl-C on `rulectl
up`, a worker host restarted) is failed by the scheduler once it is back, which would
turn a healthy run red at every restart. With a retry the task simply runs again.
Failures a retry cannot mend raise AirflowFailException, which skips the retry (invalid
rules, a crash-looping job, params outside the allow-list).
"""

from __future__ import annotations

from datetime import timedelta

TASK_DEFAULTS: dict[str, object] = {"retries": 1, "retry_delay": timedelta(seconds=30)}
