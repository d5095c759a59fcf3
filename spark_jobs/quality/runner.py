"""Run the history expectation suite with Great Expectations (1.x API) and build Data Docs.

GX runs on an ephemeral context with in-memory stores: the suite is derived from the
rules on every run (no GX project directory to keep in sync), and the only artefacts
are the Data Docs site written next to the report and the result dict returned here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from spark_jobs.quality.suite import (
    ExpectationSpec,
    TopicFields,
    parsed_time_column,
    suite_specs,
    topic_fields,
)
from spark_jobs.report.timeparse import get_path, to_epoch_ms
from spark_jobs.rules.model import AnyRule

DATA_DOCS_SITE = "rule_history"


def read_records(path: Path | str) -> tuple[list[dict], int]:
    """Records of a JSON Lines file or a Parquet file/dir, and the count of malformed lines."""
    p = Path(path)
    if p.is_dir() or p.suffix == ".parquet":
        import pandas as pd

        frame = pd.read_parquet(p)
        return json.loads(frame.to_json(orient="records", date_format="iso")), 0
    records: list[dict] = []
    malformed = 0
    with p.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                malformed += 1
                continue
            if isinstance(rec, dict):
                records.append(rec)
            else:
                malformed += 1
    return records, malformed


def history_frame(records: list[dict], fields: TopicFields):  # -> pandas.DataFrame
    """Flatten nested JSON to dotted columns and add the parsed-timestamp columns."""
    import pandas as pd

    frame = pd.json_normalize(records, sep=".") if records else pd.DataFrame()
    for t in fields.time_fields:
        frame[parsed_time_column(t)] = pd.array([to_epoch_ms(get_path(r, t)) for r in records], dtype="Int64")
    required = set(fields.required)
    for col in sorted(({u.field for u in fields.uses} | fields.condition_fields) - required):
        if col not in frame.columns:
            # Optional columns the checks filter or test on: absent means "never set"
            # (the checks then pass vacuously instead of erroring). Required columns are
            # left missing so the required-fields expectation sees the real column set.
            frame[col] = pd.Series([None] * len(frame), dtype="object")
    return frame


def _quiet_gx() -> None:
    """Great Expectations logs every function, expectation and data source it registers
    at INFO (about 200 lines, most while importing): they bury the result in a task log.
    Warnings stay."""
    import logging

    for name in ("great_expectations", "great_expectations.core", "great_expectations.expectations"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _context(data_docs_dir: Path | None):
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    _quiet_gx()  # before the import: GX logs its registrations while importing
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    ctx = gx.get_context(
        mode="ephemeral",
        project_config=DataContextConfig(
            analytics_enabled=False,
            progress_bars=ProgressBarsConfig(globally=False),
            store_backend_defaults=InMemoryStoreBackendDefaults(),
        ),
    )
    if data_docs_dir is not None:
        ctx.add_data_docs_site(
            DATA_DOCS_SITE,
            {
                "class_name": "SiteBuilder",
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(data_docs_dir)},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
    return ctx


_EXTERNAL = r"""(?:https?:)?//"""
_EXTERNAL_TAGS = (
    # <script src="https://..."></script>, <link href="https://...">, <img src="https://...">
    re.compile(r"""<script\b[^>]*\bsrc\s*=\s*["']""" + _EXTERNAL + r"""[^>]*>\s*</script\s*>""", re.I),
    re.compile(r"""<link\b[^>]*\bhref\s*=\s*["']""" + _EXTERNAL + r"""[^>]*>""", re.I),
    re.compile(r"""<img\b[^>]*\bsrc\s*=\s*["']""" + _EXTERNAL + r"""[^>]*>""", re.I),
)


def offline_data_docs(site: Path) -> int:
    """Strip every script, stylesheet and image Great Expectations' Data Docs load from
    another site (jsDelivr, unpkg, cdnjs, S3).

    GX's page templates hard-code CDN URLs and its custom-views folder can only add
    templates, not replace them, so the built pages are rewritten instead. The pages
    keep their content (server-rendered HTML tables) and work offline, and an approver
    opening them leaks nothing to, and runs nothing from, a third party; the report
    view's Content-Security-Policy refuses any that were missed. Returns how many tags
    were removed."""
    removed = 0
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        for pattern in _EXTERNAL_TAGS:
            text, n = pattern.subn("", text)
            removed += n
        page.write_text(text, encoding="utf-8")
    return removed


def _expectation(spec: ExpectationSpec):
    import great_expectations as gx

    cls = getattr(gx.expectations, spec.type)
    return cls(**spec.kwargs, description=spec.description)


def _sample(result: Mapping) -> str | None:
    vals = result.get("partial_unexpected_list")
    if vals:
        return json.dumps(vals[:5], default=str)
    missing = ((result.get("details") or {}).get("mismatched") or {}).get("missing")
    if missing:
        return "missing: " + ", ".join(map(str, missing))
    return None


# What a validation reports: counts, and a sample of the unexpected values.
WITH_SAMPLES: dict = {"result_format": "SUMMARY"}
# Counts only. On Spark, GX computes the counts of the expectations that share a domain
# (the same row condition) in one aggregate query, but fetches each expectation's sample
# with a query of its own; with no sample asked, that query reads nothing (a LIMIT 0).
COUNTS_ONLY: dict = {"result_format": "BASIC", "partial_unexpected_count": 0}


def _validation(ctx, source, topic: str, specs: list[ExpectationSpec]):  # -> gx.ValidationDefinition
    """One topic's suite as a GX validation definition over a whole-DataFrame batch."""
    import great_expectations as gx

    asset = source.add_dataframe_asset(topic)
    batch_def = asset.add_batch_definition_whole_dataframe("history")
    suite = ctx.suites.add(gx.ExpectationSuite(name=f"history.{topic}"))
    for spec in specs:
        suite.add_expectation(_expectation(spec))
    return ctx.validation_definitions.add(gx.ValidationDefinition(data=batch_def, suite=suite, name=f"history.{topic}"))


def _forget_results(ctx, suite_name: str) -> None:
    """Drop the stored results of a suite (so Data Docs show only its last run)."""
    store = ctx.validation_results_store
    for key in store.list_keys():
        if getattr(getattr(key, "expectation_suite_identifier", None), "name", None) == suite_name:
            store.remove_key(key)


def _validate(
    ctx, source, topic: str, specs: list[ExpectationSpec], frame, result_format: dict | None = None
) -> tuple[bool, list[dict]]:
    """Run one topic's suite on `frame` (pandas or Spark DataFrame, as `source` is)."""
    return _run(_validation(ctx, source, topic, specs), frame, result_format or WITH_SAMPLES)


def _run(vd, frame, result_format: dict) -> tuple[bool, list[dict]]:
    result = vd.run(batch_parameters={"dataframe": frame}, result_format=result_format)
    exps = []
    for er in result.results:
        cfg = er.expectation_config
        res = er.result or {}
        exps.append(
            {
                "type": cfg.type,
                "description": cfg.description,
                "kwargs": {k: v for k, v in cfg.kwargs.items() if k != "batch_id"},
                "success": bool(er.success),
                "unexpected_count": res.get("unexpected_count"),
                "sample": _sample(res),
                "error": (er.exception_info or {}).get("exception_message") if er.exception_info else None,
            }
        )
    return bool(result.success), exps


def run_quality(
    inputs: Mapping[str, str | Path],
    rules: Iterable[AnyRule],
    *,
    time_field: str = "timestamp",
    window_ms: Mapping[str, tuple[int, int]] | tuple[int, int] | None = None,
    data_docs_dir: Path | str | None = None,
) -> dict:
    """Validate each history input; returns a JSON-ready result (never raises on failure).

    `window_ms` is one (start, end) for every topic, or one per topic (context topics
    legitimately reach further back than the events they explain).
    """
    rules = list(rules)
    per_topic = topic_fields(rules, time_field)
    docs = Path(data_docs_dir) if data_docs_dir is not None else None
    ctx = _context(docs)

    source = ctx.data_sources.add_pandas("history")
    topics: dict[str, dict] = {}
    failed = 0
    for topic, path in sorted(inputs.items()):
        fields = per_topic.get(topic) or TopicFields()
        records, malformed = read_records(path)
        frame = history_frame(records, fields)
        win = window_ms.get(topic) if isinstance(window_ms, Mapping) else window_ms
        specs = suite_specs(fields, win)
        ok, exps = _validate(ctx, source, topic, specs, frame)
        # Lines that are not JSON objects never reach GX (or a rule: the backtest
        # dead-letters them); they are counted and shown, not judged here.
        failed += sum(1 for e in exps if not e["success"])
        topics[topic] = {
            "path": str(path),
            "records": len(records),
            "malformed": malformed,
            "success": ok,
            "expectations": exps,
        }
    if docs is not None:
        ctx.build_data_docs(site_names=[DATA_DOCS_SITE])
        offline_data_docs(docs)
    success = all(t["success"] for t in topics.values())
    return {
        "success": success,
        "failed_expectations": failed,
        "malformed": sum(t["malformed"] for t in topics.values()),
        "topics": topics,
        "data_docs_dir": str(docs) if docs is not None else None,
        "engine": "great_expectations",
    }
