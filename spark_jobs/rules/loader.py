"""Load rule files and report every problem with its file, field and reason.

A rule file holds one rule (a mapping) or several (a list of mappings). Loading never
stops at the first problem: a pull request gets the whole list in one run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from spark_jobs.rules.model import AnyRule, CorrelationRule, VelocityRule, _FieldError, parse_rule

RULE_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class RuleError:
    """One validation problem. `field` is a dotted/indexed path, `-` for the whole rule."""

    file: str
    field: str
    reason: str
    rule_id: str | None = None

    def __str__(self) -> str:
        who = f" rule {self.rule_id!r}" if self.rule_id else ""
        return f"{self.file}:{who} field '{self.field}': {self.reason}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LoadedRule:
    rule: AnyRule
    file: str
    index: int  # position in a multi-rule file, 0 for a single-rule file


@dataclass
class LoadResult:
    rules: list[LoadedRule]
    errors: list[RuleError]

    @property
    def ok(self) -> bool:
        return not self.errors

    def by_id(self) -> dict[str, LoadedRule]:
        return {lr.rule.rule_id: lr for lr in self.rules}


def discover_rule_files(paths: Iterable[str | Path]) -> list[Path]:
    """Rule files under the given files/directories, sorted; `schema/` dirs are skipped."""
    found: set[Path] = set()
    for p in map(Path, paths):
        if p.is_dir():
            for f in p.rglob("*"):
                if f.is_file() and f.suffix in RULE_SUFFIXES and "schema" not in f.relative_to(p).parts:
                    found.add(f)
        elif p.exists():
            found.add(p)
        else:
            # Reported by the caller as a usage error; keep discovery pure.
            continue
    return sorted(found)


def _loc_to_field(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "-"


_TYPE_TAGS = {"int": "an integer", "float": "a number", "bool": "a boolean", "str": "a string"}
_JSON_TYPE = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "mapping"}


def _pydantic_errors(exc: ValidationError, file: str, rule_id: str | None, prefix: str) -> list[RuleError]:
    errors: list[RuleError] = []
    unions: dict[str, tuple[list[str], object]] = {}
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        # With a discriminated union, pydantic prefixes the loc with the rule_type tag.
        if loc and loc[0] in ("threshold", "velocity", "correlation"):
            loc = loc[1:]
        if loc and loc[-1] in _TYPE_TAGS and err["type"].endswith("_type"):
            # One error per member of a scalar union (int | float ...): merge them below.
            key = prefix + _loc_to_field(loc[:-1])
            unions.setdefault(key, ([], err["input"]))[0].append(_TYPE_TAGS[loc[-1]])
            continue
        field = _loc_to_field(loc)
        reason = err["msg"]
        ctx_err = (err.get("ctx") or {}).get("error")
        if isinstance(ctx_err, _FieldError):
            field, reason = ctx_err.field, ctx_err.reason
        elif err["type"] == "missing":
            reason = "required field is missing"
        elif err["type"] == "extra_forbidden":
            reason = "unknown field (not part of the rule language)"
        elif err["type"] == "union_tag_invalid":
            field = "rule_type"
            reason = f"must be one of 'threshold', 'velocity', 'correlation' (got {err['input'].get('rule_type')!r})"
        elif err["type"] == "union_tag_not_found":
            field = "rule_type"
            reason = "required field is missing"
        errors.append(RuleError(file, prefix + field, reason, rule_id))
    for field, (expected, value) in unions.items():
        got = _JSON_TYPE.get(type(value), type(value).__name__)
        wanted = " or ".join(dict.fromkeys("a number" if e == "an integer" else e for e in expected))
        errors.append(RuleError(file, field, f"wrong type: expected {wanted}, got {got} {value!r}", rule_id))
    return errors


def parse_documents(text: str, file: str) -> tuple[list[object], list[RuleError], bool]:
    """The rule mappings of one file, its parse errors, and whether it was a list."""
    try:
        data = json.loads(text) if file.endswith(".json") else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        return [], [RuleError(file, "-", f"not valid YAML/JSON: {exc}".replace("\n", " "))], False
    if data is None:
        return [], [RuleError(file, "-", "file is empty")], False
    if isinstance(data, dict):
        return [data], [], False
    if isinstance(data, list):
        return data, [], True
    return [], [RuleError(file, "-", "a rule file holds a mapping (one rule) or a list of rules")], False


def validate_mapping(data: object, file: str, index: int | None = None) -> tuple[AnyRule | None, list[RuleError]]:
    prefix = f"[{index}]." if index is not None else ""
    rule_id = data.get("rule_id") if isinstance(data, dict) else None
    rule_id = rule_id if isinstance(rule_id, str) else None
    if not isinstance(data, dict):
        return None, [RuleError(file, prefix.rstrip(".") or "-", "a rule must be a mapping")]
    try:
        return parse_rule(data), []
    except ValidationError as exc:
        return None, _pydantic_errors(exc, file, rule_id, prefix)


def load_text(text: str, file: str) -> LoadResult:
    docs, errors, multi = parse_documents(text, file)
    rules: list[LoadedRule] = []
    for i, doc in enumerate(docs):
        rule, errs = validate_mapping(doc, file, i if multi else None)
        errors.extend(errs)
        if rule is not None:
            rules.append(LoadedRule(rule, file, i))
    return LoadResult(rules, errors)


def load_files(files: Iterable[Path], root: Path | None = None) -> LoadResult:
    result = LoadResult([], [])
    for f in files:
        name = _display(f, root)
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            result.errors.append(RuleError(name, "-", f"cannot read file: {exc}"))
            continue
        part = load_text(text, name)
        result.rules.extend(part.rules)
        result.errors.extend(part.errors)
    return result


def _display(f: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return str(f.resolve().relative_to(root.resolve()))
        except ValueError:
            pass
    return str(f)


def cross_rule_errors(rules: list[LoadedRule]) -> list[RuleError]:
    """Checks that need the whole set: unique ids and velocity-filter references."""
    errors: list[RuleError] = []
    seen: dict[str, LoadedRule] = {}
    for lr in rules:
        rid = lr.rule.rule_id
        if rid in seen:
            errors.append(
                RuleError(lr.file, "rule_id", f"duplicate rule_id {rid!r} (also defined in {seen[rid].file})", rid)
            )
        else:
            seen[rid] = lr
    for lr in rules:
        rule = lr.rule
        if not isinstance(rule, CorrelationRule) or rule.velocity_filter_rule_id is None:
            continue
        ref = rule.velocity_filter_rule_id
        target = seen.get(ref)
        field = "velocity_filter_rule_id"
        if target is None:
            errors.append(RuleError(lr.file, field, f"names rule {ref!r}, which does not exist", rule.rule_id))
        elif not isinstance(target.rule, VelocityRule):
            errors.append(
                RuleError(lr.file, field, f"names rule {ref!r}, which is a {target.rule.rule_type} rule, not velocity", rule.rule_id)
            )
        elif target.rule.emit_to_sink:
            errors.append(
                RuleError(lr.file, field, f"names velocity rule {ref!r}, which must have emit_to_sink: false", rule.rule_id)
            )
        elif target.rule.source_topic != rule.source_topic:
            errors.append(
                RuleError(
                    lr.file,
                    "source_topic",
                    f"must equal the source_topic of velocity rule {ref!r} ({target.rule.source_topic!r}); "
                    "its primaries are that rule's events",
                    rule.rule_id,
                )
            )
    return errors


def load_rules(paths: Iterable[str | Path], root: Path | None = None) -> LoadResult:
    """Load and fully validate a rule set (per-file and cross-rule checks)."""
    result = load_files(discover_rule_files(paths), root)
    result.errors.extend(cross_rule_errors(result.rules))
    return result
