"""The version-bump check: a rule whose content changed must carry a new `version`.

The running job replaces a rule only when its version changes, so an edit that keeps
the old version would never reach production. The base is a git ref (the PR's target
branch, or the last published commit).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from spark_jobs.rules.loader import LoadedRule, RuleError, load_text
from spark_jobs.rules.model import rule_to_json_dict
from spark_jobs.rules.version_order import compare_versions


class GitError(RuntimeError):
    pass


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def repo_root(path: Path) -> Path:
    start = path if path.is_dir() else path.parent
    return Path(_git(start, "rev-parse", "--show-toplevel").strip())


def changed_files(repo: Path, base: str, paths: list[Path]) -> set[Path]:
    """Files under `paths` that differ from `base` (committed, staged, unstaged or new)."""
    rel = [str(p.resolve().relative_to(repo.resolve())) for p in paths]
    out = _git(repo, "diff", "--name-only", base, "--", *rel)
    out += _git(repo, "ls-files", "--others", "--exclude-standard", "--", *rel)
    return {(repo / line).resolve() for line in out.splitlines() if line.strip()}


def rules_at(repo: Path, ref: str, paths: list[Path]) -> dict[str, dict]:
    """rule_id -> canonical JSON of each valid rule in the tree at `ref`."""
    rel = [str(p.resolve().relative_to(repo.resolve())) for p in paths]
    names = _git(repo, "ls-tree", "-r", "--name-only", ref, "--", *rel).splitlines()
    out: dict[str, dict] = {}
    for name in names:
        if not name.endswith((".yaml", ".yml", ".json")) or "/schema/" in f"/{name}":
            continue
        text = _git(repo, "show", f"{ref}:{name}")
        for lr in load_text(text, name).rules:  # invalid rules at base are ignored
            out[lr.rule.rule_id] = rule_to_json_dict(lr.rule)
    return out


def version_bump_errors(current: list[LoadedRule], base_rules: dict[str, dict]) -> list[RuleError]:
    errors: list[RuleError] = []
    for lr in current:
        old = base_rules.get(lr.rule.rule_id)
        if old is None:
            continue
        new = rule_to_json_dict(lr.rule)
        if new != old and new["version"] == old["version"]:
            changed = sorted(k for k in set(new) | set(old) if new.get(k) != old.get(k))
            errors.append(
                RuleError(
                    lr.file,
                    "version",
                    f"rule changed ({', '.join(changed)}) but version is still {old['version']!r}; "
                    "bump the version so the running job picks the change up",
                    lr.rule.rule_id,
                )
            )
        elif new != old and compare_versions(new["version"], old["version"]) < 0:
            errors.append(
                RuleError(
                    lr.file,
                    "version",
                    f"version {new['version']!r} is lower than {old['version']!r}; the running job applies "
                    "only newer versions (1 < 2 < 10, 1.9 < 1.10, v2 < v10)",
                    lr.rule.rule_id,
                )
            )
    return errors


def changed_rule_ids(current: list[LoadedRule], base_rules: dict[str, dict]) -> list[str]:
    """Rules that are new or whose canonical content differs from the base."""
    return sorted(
        lr.rule.rule_id for lr in current if base_rules.get(lr.rule.rule_id) != rule_to_json_dict(lr.rule)
    )
