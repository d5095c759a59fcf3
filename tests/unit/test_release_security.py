"""Issue 13, items 4 and 5 without Airflow: what the approver reads cannot be forged by
a commit message, trigger params are an allow-list, and Data Docs load nothing from
another site.

The oracles are independent of the code under test: a CommonMark renderer
(markdown-it-py, stricter than the UI's react-markdown since it passes raw HTML
through) for the approval text, the `jsonschema` library (what Airflow validates
params with) for the params schema, and plain text searches over the built HTML.
"""

from __future__ import annotations

import re
from pathlib import Path

import jsonschema
import pytest
from markdown_it import MarkdownIt

from spark_jobs.lifecycle import release
from spark_jobs.lifecycle.params import (
    ParamsRejected,
    ReleaseParams,
    ReportParams,
    param_schema,
    resolve_history_inputs,
)
from spark_jobs.lifecycle.settings import run_settings

ROOT = Path(__file__).resolve().parents[2]

EVIL_SUBJECT = "fix **APPROVED BY SECURITY** [docs](http://evil.example/x) <img src=x onerror=alert(1)> | x |"
EVIL_AUTHOR = "Mallory <b>Admin</b> <mallory@example.com> www.evil.example"
EVIL_DIFF = "-threshold: 10\n+threshold: 8\n```\n**not code any more** <script>alert(1)</script>\n"


def _report(diff: str = EVIL_DIFF) -> dict:
    return {
        "context": {"commit": "a" * 40, "author": EVIL_AUTHOR, "commit_subject": EVIL_SUBJECT, "base_commit": "b" * 40},
        "marks": [{"level": "warning", "text": "quality <i>failed</i>"}],
        "rules": [
            {"rule_id": "rapid_clicks", "published_version": "1", "candidate_version": "2|<u>x</u>",
             "published": {"detections": 3}, "candidate": {"detections": 5}, "added": 2, "removed": 0, "diff": diff},
        ],
    }


def _render(markdown: str) -> str:
    # GitHub-flavoured like the UI's renderer: tables, and bare URLs/e-mails become links.
    return MarkdownIt("gfm-like").render(markdown)


def test_approval_page_says_a_promotion_and_who_may_not_decide_it() -> None:
    report = {**_report(), "promotes": [{"rule_id": "rapid_clicks", "version": "2",
                                         "shadow_approved_by": {"id": "7", "name": "dave <b>x</b>"}}]}
    html = _render(release.approval_body(report, "/rule-reports/dags/rule_release/runs/r1/", "rules.active"))
    text = re.sub(r"<[^>]+>", "", html)
    assert ("Promotion: puts in force rapid_clicks v2, the version its shadow runs, released as a shadow by "
            "dave &lt;b&gt;x&lt;/b&gt;, who may not decide this one: a second approver must.") in text
    assert "<b>" not in html


def test_approval_page_renders_git_text_as_text() -> None:
    body = release.approval_body(_report(), "/rule-reports/dags/rule_release/runs/r1/", "rules.active")
    html = _render(body)
    # The only link is ours; nothing from git became a tag.
    assert re.findall(r"<a href=\"([^\"]*)\"", html) == ["/rule-reports/dags/rule_release/runs/r1/"]
    for tag in ("<img", "<b>", "<script", "<u>", "<i>"):
        assert tag not in html, tag
    assert html.count("<strong>") == 4  # "Commit", the report link, "Release as", "Rule diff:"; not the subject's
    assert "mailto:" not in html
    # ... and the text reads as written (HTML-escaped by the renderer).
    assert "fix **APPROVED BY SECURITY** [docs](http://evil.example/x) &lt;img src=x onerror=alert(1)&gt; | x |" in html
    assert "Mallory &lt;b&gt;Admin&lt;/b&gt; &lt;mallory@example.com&gt; www.evil.example" in html
    # The diff stays inside its code block even though it holds a ``` line.
    code = re.findall(r"<pre><code class=\"language-diff\">(.*?)</code></pre>", html, re.S)
    assert len(code) == 1 and "**not code any more** &lt;script&gt;" in code[0] and "+threshold: 8" in code[0]
    # One table row per rule: the pipe in the version did not add a cell.
    row = re.findall(r"<tr>\s*<td><code>rapid_clicks</code></td>(.*?)</tr>", html, re.S)
    assert len(row) == 1 and row[0].count("<td>") == 5


@pytest.mark.parametrize(
    "settings",
    [
        {"spark_conf": {"spark.pyspark.python": "/bin/sh"}},
        {"spark_conf": {"spark.driver.extraJavaOptions": "-XX:OnOutOfMemoryError=touch /tmp/x"}},
        {"spark_master": "local[*]"},
        {"state_dir": "/tmp/elsewhere"},
        {"history_inputs": {"events.raw": "/etc/passwd"}},
        {"history_inputs": {"events.raw": "../../../etc/passwd"}},
        {"history_inputs": {"events.raw": "demo/../../etc/passwd"}},
        {"history_inputs": {"bad topic!": "events.raw.jsonl"}},
        {"history_lookback_hours": -1},
    ],
)
def test_params_outside_the_allow_list_are_refused(settings: dict) -> None:
    # What Airflow checks at trigger time: the Param's JSON Schema.
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(settings, param_schema(ReleaseParams, "settings"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(settings, param_schema(ReportParams, "settings"))
    # What the tasks check again.
    with pytest.raises(ParamsRejected):
        run_settings({"commit": None, "settings": settings}, ReleaseParams, use_airflow=False)


def test_commit_param_is_a_commit_id() -> None:
    schema = param_schema(ReleaseParams, "commit")
    jsonschema.validate("0123abcd", schema)
    jsonschema.validate(None, schema)
    for bad in ("--upload-pack=touch /tmp/x", "main; rm -rf /", "HEAD~1"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_allowed_params_reach_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "day1").mkdir()
    (tmp_path / "day1" / "events.jsonl").write_text("{}\n")
    monkeypatch.setenv("RULE_LIFECYCLE_HISTORY_ROOT", str(tmp_path))
    settings = {"history_inputs": {"events.raw": "day1/events.jsonl"}, "history_lookback_hours": 6, "report_max_rows": 50}
    jsonschema.validate(settings, param_schema(ReleaseParams, "settings"))
    s = run_settings({"commit": "abcdef1", "settings": settings}, ReleaseParams, use_airflow=False)
    assert s.history_inputs == {"events.raw": str(tmp_path / "day1" / "events.jsonl")}
    assert s.history_lookback_hours == 6 and s.report_max_rows == 50
    assert s.spark_conf["spark.sql.shuffle.partitions"] == "2"  # the operator's, untouched


def test_a_symlink_cannot_lead_out_of_the_history_root(tmp_path: Path) -> None:
    root = tmp_path / "history"
    root.mkdir()
    (root / "etc").symlink_to("/etc")
    with pytest.raises(ParamsRejected, match="leaves the history root"):
        resolve_history_inputs(root, {"events.raw": "etc/passwd"})


def test_data_docs_load_nothing_from_another_site(tmp_path: Path) -> None:
    from spark_jobs.quality import run_quality
    from spark_jobs.rules.loader import load_rules

    rules = [lr.rule for lr in load_rules([ROOT / "rules"]).rules]
    demo = ROOT / "tests" / "data" / "demo"
    docs = tmp_path / "data_docs"
    run_quality({"events.raw": demo / "events.raw.jsonl"}, rules, data_docs_dir=docs)
    pages = list(docs.rglob("*.html"))
    assert len(pages) >= 2  # the index and a validation page
    external = re.compile(r"<(script|link|img)\b[^>]*\b(src|href)\s*=\s*[\"']?(https?:)?//", re.I)
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not external.search(text), (page, external.search(text).group(0))
    # The content is still there.
    assert any("history.events.raw" in p.read_text(encoding="utf-8") for p in pages)
