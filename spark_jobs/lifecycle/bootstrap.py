"""What a platform start may put on `rules.active`: a bootstrap of an empty topic, nothing else.

The only path to the live rules is an approved release (dags/rule_release.py: validate,
backtest, four-eyes approval, publish, audit). A start of `rulectl up` must not open a
second one: if it published `rules/` on every start, a change committed and waiting for
approval (or an uncommitted edit) would go live at the next Ctrl-C and `make up`, with
no approver and no audit record.

So a start publishes only when the topic holds no rule at all (the first start of a work
folder, or a broker log removed by hand), and then only rules that were committed:

* the rules of the last release the audit records as published, if there is one (the
  topic was emptied: put back what was approved, not what came after it);
* else the rules of the repository's HEAD (never the working tree's uncommitted edits).

That publication is recorded in the audit as a bootstrap (`bootstrap: true`, approved by
nobody), so `rulectl history` and the next release's base commit know of it. When the
topic holds rules, a start publishes nothing and lists the rule files that differ from
what is live: they wait for a release.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from spark_jobs.lifecycle import audit
from spark_jobs.rules.loader import LoadedRule, LoadResult, RuleError, load_rules
from spark_jobs.rules.model import rule_to_json_dict


@dataclass(frozen=True)
class Drift:
    """A rule whose file and live record differ; `None` is "absent on that side"."""

    rule_id: str
    file: str | None
    here: str | None  # the version in the rule files
    live: str | None  # the version on rules.active

    def describe(self) -> str:
        if self.live is None:
            return f"{self.file}: {self.rule_id} v{self.here} is new (not live)"
        if self.here is None:
            return f"{self.rule_id} v{self.live} is live but has no rule file any more"
        if self.here == self.live:
            return f"{self.file}: {self.rule_id} v{self.here} differs from the live v{self.live}"
        return f"{self.file}: {self.rule_id} v{self.here} here, v{self.live} live"


@dataclass
class StartRules:
    """What the start did with the rules, for the terminal and the tests."""

    bootstrapped: bool
    live_count: int
    published: list[str] = field(default_factory=list)
    source: str = ""
    drift: list[Drift] = field(default_factory=list)
    uncommitted: list[str] = field(default_factory=list)
    errors: list[RuleError] = field(default_factory=list)
    record: dict | None = None

    def lines(self, rules_dir: str) -> list[str]:
        """What the terminal says, one line each."""
        if self.errors:
            head = (f"{len(self.errors)} invalid rule(s) in {self.source or rules_dir}: nothing published"
                    if self.bootstrapped else
                    f"{len(self.errors)} invalid rule(s) in {rules_dir}; a release would refuse them")
            return [*(f"ERROR {e}" for e in self.errors), head]
        out = []
        if self.bootstrapped:
            out.append(f"rules.active was empty: published {len(self.published)} rule(s) from {self.source} "
                       "(recorded in the release audit as a bootstrap)")
        else:
            out.append(f"rules.active holds {self.live_count} rule(s) from releases: nothing published at start")
        if self.uncommitted:
            out.append(f"not published, uncommitted: {', '.join(self.uncommitted)} (commit them; a release publishes them)")
        if self.drift:
            out.append(f"{len(self.drift)} rule(s) in {rules_dir} differ from rules.active and wait for a release "
                       "(rule_release in Airflow):")
            out.extend(f"  {d.describe()}" for d in self.drift)
        return out


def drift(files: list[LoadedRule], live: Mapping[str, dict]) -> list[Drift]:
    """Rules whose file differs from the live record, and live rules without a file."""
    out = []
    for lr in files:  # by live id: a shadow file is the record `<rule_id>@shadow`
        old = live.get(lr.rule.live_id)
        if old != rule_to_json_dict(lr.rule):
            out.append(Drift(lr.rule.live_id, lr.file, lr.rule.version, None if old is None else str(old.get("version"))))
    named = {lr.rule.live_id for lr in files} | {lr.rule.rule_id for lr in files}
    out.extend(Drift(rid, None, None, str(r.get("version"))) for rid, r in sorted(live.items()) if rid not in named)
    return sorted(out, key=lambda d: d.rule_id)


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True)


def _text(proc: subprocess.CompletedProcess[bytes]) -> str | None:
    out = proc.stdout.decode().strip()
    return out if proc.returncode == 0 and out else None


def load_at_commit(rules_dir: Path, commit: str) -> LoadResult:
    """The rules of `rules_dir` as committed in `commit` (git archive, no checkout of
    the user's tree), with file names as the repository has them."""
    top = Path(_text(_git(rules_dir, "rev-parse", "--show-toplevel")) or rules_dir)
    prefix = _text(_git(rules_dir, "rev-parse", "--show-prefix")) or ""
    archive = _git(top, "archive", "--format=tar", commit, "--", prefix or ".")
    with tempfile.TemporaryDirectory(prefix="rules-at-commit-") as tmp:
        if archive.returncode != 0:
            reason = archive.stderr.decode().strip() or "git archive failed"
            return LoadResult([], [RuleError(prefix or str(rules_dir), "-", f"cannot read commit {commit[:12]}: {reason}")])
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        return load_rules([Path(tmp) / prefix], root=Path(tmp))


def uncommitted_files(rules_dir: Path) -> list[str]:
    """Rule files with changes that are not in HEAD (modified, added or untracked)."""
    out = _git(rules_dir, "status", "--porcelain", "--untracked-files=all", "--", ".")
    if out.returncode != 0:
        return []
    return sorted(line[3:].strip() for line in out.stdout.decode().splitlines() if line.strip())


def start_rules(
    rules_dir: Path,
    audit_dir: Path,
    live_rules: Callable[[], dict[str, dict]],
    publish: Callable[[list, str | None], Mapping[str, tuple[int, int]]],
    *,
    branch: str = "main",
) -> StartRules:
    """Bootstrap an empty `rules.active`, or leave it alone and list the drift.

    `live_rules()` reads the topic; `publish(rules, commit)` publishes and returns the
    (partition, offset) of each rule it sent, by rule id. Both are the caller's, so the decision is tested without a broker.
    """
    live = live_rules()
    files = load_rules([rules_dir], root=_root(rules_dir))
    if live:
        return StartRules(False, len(live), drift=drift(files.rules, live), errors=list(files.errors),
                          uncommitted=[])
    head = _text(_git(rules_dir, "rev-parse", "HEAD"))
    if head is None:  # not a git repository: the folder is all there is, and the audit says so
        loaded, commit, source, uncommitted = files, None, f"{rules_dir} (not in git)", []
    else:
        last = audit.last_published_commit(audit_dir)
        known = last is not None and _git(rules_dir, "cat-file", "-e", f"{last}^{{commit}}").returncode == 0
        commit = last if known else head
        source = f"the last approved release {commit[:12]}" if known else f"commit {commit[:12]} (HEAD)"
        loaded = load_at_commit(rules_dir, commit)
        uncommitted = uncommitted_files(rules_dir)
    if loaded.errors:
        return StartRules(True, 0, source=source, errors=list(loaded.errors))
    offsets = publish([lr.rule for lr in loaded.rules], commit)
    sent = sorted(offsets)
    top = _text(_git(rules_dir, "rev-parse", "--show-toplevel")) or str(rules_dir)
    record = audit.append_record(audit_dir, {
        "event": "published", "bootstrap": True, "commit": commit, "repo": top, "branch": branch,
        "dag_id": None, "run_id": None, "approved_by": None, "decided_by": {"id": None, "name": "rulectl up (start)"},
        "reason": f"rules.active was empty at platform start: published {source}",
        "rules": [{"rule_id": lr.rule.rule_id, "mode": lr.rule.mode, "version": lr.rule.version,
                   "previous_version": None, "produced": True, "file": lr.file,
                   **_where(offsets.get(lr.rule.live_id))}
                  for lr in sorted(loaded.rules, key=lambda lr: lr.rule.rule_id)],
    })
    after = {lr.rule.live_id: rule_to_json_dict(lr.rule) for lr in loaded.rules}
    return StartRules(True, len(after), published=sent, source=source, drift=drift(files.rules, after),
                      uncommitted=uncommitted, record=record)


def _where(offset: tuple[int, int] | None) -> dict:
    return {} if offset is None else {"partition": offset[0], "offset": offset[1]}


def _root(rules_dir: Path) -> Path | None:
    top = _text(_git(rules_dir, "rev-parse", "--show-toplevel"))
    return Path(top) if top else None
