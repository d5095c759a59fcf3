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

    :param commit: explicit commit-ish (templated), or empty to track the branch.
    :param settings_overrides: settings for this run (templated dict, e.g. from params).
    """

    template_fields: Sequence[str] = ("commit", "settings_overrides")
    ui_color = "#e0ecfd"

    def __init__(self, *, commit: str | None = None, settings_overrides: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commit = commit
        self.settings_overrides = settings_overrides

    def poke(self, context: Any) -> PokeReturnValue:
        from spark_jobs.lifecycle.release import detect_candidate
        from spark_jobs.lifecycle.settings import resolve_settings

        overrides = self.settings_overrides if isinstance(self.settings_overrides, dict) else {}
        settings = resolve_settings(overrides)
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
