"""Sensor: wait for a commit on the tracked branch whose rules have not been released."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.common.compat.sdk import BaseSensorOperator, PokeReturnValue


class RulesCommitSensor(BaseSensorOperator):
    """Poke the rules repository; done when there is a commit to release.

    The commit is the run's `commit` param when given (a manual run: released even if it
    was seen before), else the head of the tracked branch when no earlier run decided it
    and its `rules/` differ from the last published commit. The XCom value is the
    candidate: commit metadata, the base commit and the run's resolved settings.

    The run's params pass the allow-list (spark_jobs.lifecycle.params.ReleaseParams)
    again here: the api-server already refused a bad trigger, but a run created another
    way (`airflow dags test -c`) must not slip past it. The check runs in `execute`,
    before the sensor's poke loop: that loop turns a failure into a skip (`soft_fail`,
    which an idle poll needs), and a refused run must fail, not read as "nothing new".

    :param commit: explicit commit id (templated), or empty to track the branch.
    """

    template_fields: Sequence[str] = ("commit",)
    ui_color = "#e0ecfd"

    def __init__(self, *, commit: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commit = commit
        self._settings: Any = None

    @staticmethod
    def _run_settings(context: Any) -> Any:
        """The run's settings after the params allow-list; AirflowFailException if refused."""
        from airflow.providers.common.compat.sdk import AirflowFailException

        from spark_jobs.lifecycle.params import ParamsRejected, ReleaseParams
        from spark_jobs.lifecycle.settings import run_settings

        try:
            return run_settings(dict(context.get("params") or {}), ReleaseParams)
        except ParamsRejected as exc:
            raise AirflowFailException(f"{exc} (the run's params are an allow-list: spark_jobs/lifecycle/params.py)") from None

    def execute(self, context: Any) -> Any:
        # Outside BaseSensorOperator.execute's poke loop, so soft_fail cannot skip a refusal.
        self._settings = self._run_settings(context)
        return super().execute(context)

    def poke(self, context: Any) -> PokeReturnValue:
        from spark_jobs.lifecycle.release import detect_candidate

        settings = self._settings if self._settings is not None else self._run_settings(context)
        commit = (self.commit or "").strip() or None
        if commit in ("None", "null"):
            commit = None
        candidate = detect_candidate(settings, commit)
        if candidate is None:
            self.log.info("No new rules commit on %s of %s", settings.branch, settings.repo)
            return PokeReturnValue(is_done=False)
        self.log.info(
            "Releasing %s (%s) by %s; last published commit: %s",
            candidate["short"],
            candidate["subject"],
            candidate["author"],
            candidate["base_commit"] or "none",
        )
        return PokeReturnValue(is_done=True, xcom_value=candidate)
