"""What `rulectl validate` (and the release DAG) run: per-file, cross-rule and
version-bump checks, optionally limited to the files changed since a git base ref."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from spark_jobs.rules.loader import (
    LoadedRule,
    RuleError,
    cross_rule_errors,
    discover_rule_files,
    load_files,
)
from spark_jobs.rules.versioning import (
    changed_files,
    changed_rule_ids,
    repo_root,
    rules_at,
    version_bump_errors,
)


@dataclass
class ValidationReport:
    rules: list[LoadedRule]
    errors: list[RuleError]
    checked_files: list[str]
    base: str | None = None
    changed_rule_ids: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "base": self.base,
            "checked_files": self.checked_files,
            "rules": sorted(lr.rule.rule_id for lr in self.rules),
            "changed_rule_ids": self.changed_rule_ids,
            "errors": [e.to_dict() for e in self.errors],
        }


def validate_paths(paths: list[Path], base: str | None = None, repo: Path | None = None) -> ValidationReport:
    """Validate the rule files under `paths`.

    Without `base`, every file is checked. With `base`, per-file errors are reported
    only for files changed since `base` (a PR should not fail on a neighbour's old
    problem), while cross-rule checks always see the whole set, and every changed
    rule must carry a version different from the one at `base`.
    """
    files = discover_rule_files(paths)
    root = repo or (repo_root(paths[0]) if base else None)
    loaded = load_files(files, root if root else Path.cwd())
    errors: list[RuleError] = []
    checked = [f for f in files]
    changed_ids: list[str] = []
    if base is None:
        errors.extend(loaded.errors)
    else:
        assert root is not None
        changed = changed_files(root, base, paths)
        checked = [f for f in files if f.resolve() in changed]
        checked_names = {_rel(f, root) for f in checked}
        errors.extend(e for e in loaded.errors if e.file in checked_names)
        base_rules = rules_at(root, base, paths)
        errors.extend(version_bump_errors(loaded.rules, base_rules))
        changed_ids = changed_rule_ids(loaded.rules, base_rules)
    errors.extend(cross_rule_errors(loaded.rules))
    return ValidationReport(
        rules=loaded.rules,
        errors=errors,
        checked_files=[_rel(f, root or Path.cwd()) for f in checked],
        base=base,
        changed_rule_ids=changed_ids,
    )


def _rel(f: Path, root: Path) -> str:
    try:
        return str(f.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(f)
