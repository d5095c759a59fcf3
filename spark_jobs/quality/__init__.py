"""Data quality of the event history with Great Expectations (1.x).

`run_quality(inputs, rules, ...)` validates every history input against a suite derived
from the rules that read it, builds Data Docs, and returns a JSON-ready result that the
backtest report embeds. A failing suite marks the report; it never stops the backtest.
"""

from spark_jobs.quality.runner import DATA_DOCS_SITE, read_records, run_quality
from spark_jobs.quality.suite import ExpectationSpec, TopicFields, suite_specs, topic_fields

__all__ = [
    "DATA_DOCS_SITE",
    "ExpectationSpec",
    "TopicFields",
    "read_records",
    "run_quality",
    "suite_specs",
    "topic_fields",
]
