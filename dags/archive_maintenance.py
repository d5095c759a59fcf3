"""archive_maintenance: retention and compaction of the event archive (Delta Lake).

Every run deletes the archive's date partitions older than `archive_retention_days`,
bin-packs the streaming writer's small files (OPTIMIZE) and removes files no version
within `archive_vacuum_hours` references (VACUUM). The table is the lifecycle setting
`archive_table` (`rulectl up` points it at its work folder). Logic:
spark_jobs.archive.maintenance. Schedule: RULE_ARCHIVE_MAINTENANCE_SCHEDULE (default
@daily); a run with no table yet does nothing.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from airflow.sdk import DAG, task
from rule_lifecycle.defaults import periodic

log = logging.getLogger(__name__)

with DAG(
    dag_id="archive_maintenance",
    description="Event archive: delete partitions past retention, OPTIMIZE, VACUUM",
    # First run at the next scheduled time (rule_lifecycle.defaults.periodic).
    schedule=periodic("RULE_ARCHIVE_MAINTENANCE_SCHEDULE", "@daily"),
    catchup=False,
    max_active_runs=1,
    tags=["rules", "archive"],
    doc_md=__doc__,
) as dag:

    @task(retries=2, retry_delay=timedelta(minutes=5), execution_timeout=timedelta(hours=2))
    def maintain_archive() -> dict:
        """Retention, OPTIMIZE and VACUUM in one Spark session (its start-up is the cost)."""
        from spark_jobs.archive.maintenance import maintain
        from spark_jobs.lifecycle.settings import resolve_settings
        from spark_jobs.spark import session

        settings = resolve_settings()
        spark = session("archive-maintenance", master=settings.spark_master, extra=settings.spark_conf)
        try:
            result = maintain(spark, settings.archive_table, settings.archive_retention_days,
                              settings.archive_vacuum_hours)
        finally:
            spark.stop()
        log.info("archive maintenance: %s", result)
        return result

    maintain_archive()
