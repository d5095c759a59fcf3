"""The conformance vectors (tests/conformance/vectors/*.yaml, written by hand from
docs/rule-language.md) and the check of an engine's output against them.

All vectors run in one pass per engine path: each gets its own topics and rule ids
(prefix `cvNNN`), so one backtest or one live job evaluates them all without one
vector's events reaching another's rules. The check derives everything it compares
from the spec, never from engine code: the record is the event's text with the members
appended in the contract's order, the id is the first half of SHA-256 over rule id,
version, topic and text separated by U+001F, numbers equal within 1e-9 relative.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

VECTORS_DIR = Path(__file__).resolve().parent / "vectors"
ENGINES = ("backtest", "live")
TOPICS = ("events.raw", "context.raw")


@dataclass
class Record:
    topic: str  # the vector's own topic (prefixed)
    value: bytes | None  # None: a record without a value
    text: str | None  # the value as text, when it is UTF-8


@dataclass
class Vector:
    path: Path
    index: int
    doc: dict = field(repr=False)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def prefix(self) -> str:
        return f"cv{self.index:03d}"

    def runs_on(self, engine: str) -> bool:
        return engine in self.doc.get("only", ENGINES)

    def topic(self, topic: str) -> str:
        return f"{self.prefix}.{topic}"

    def rule_id(self, rule_id: str) -> str:
        return f"{self.prefix}_{rule_id}"

    def rules(self) -> list[dict]:
        """The vector's rules under its own ids and topics."""
        out = []
        for rule in self.doc["rules"]:
            r = dict(rule)
            r["rule_id"] = self.rule_id(r["rule_id"])
            for key in ("source_topic", "context_topic"):
                if key in r:
                    r[key] = self.topic(r[key])
            if r.get("velocity_filter_rule_id"):
                r["velocity_filter_rule_id"] = self.rule_id(r["velocity_filter_rule_id"])
            out.append(r)
        return out

    def records(self) -> list[Record]:
        out = []
        for ev in self.doc["events"]:
            topic = self.topic(ev.get("topic", "events.raw"))
            if ev.get("empty"):
                out.append(Record(topic, None, None))
            elif "bytes_hex" in ev:
                data = bytes.fromhex(ev["bytes_hex"].replace(" ", ""))
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError:
                    text = None
                out.append(Record(topic, data, text))
            else:
                text = ev["text"] if "text" in ev else json.dumps(ev["value"], separators=(",", ":"))
                out.append(Record(topic, text.encode(), text))
        return out

    def rule_doc(self, rule_id: str) -> dict:
        return next(r for r in self.doc["rules"] if r["rule_id"] == rule_id)


def load_vectors() -> list[Vector]:
    paths = sorted(VECTORS_DIR.glob("*.yaml"))
    return [Vector(p, i, yaml.safe_load(p.read_text())) for i, p in enumerate(paths)]


# --------------------------------------------------------------------------- the check


def detection_id(rule_id: str, version: str, topic: str, text: str) -> str:
    """docs/rule-language.md, "The detection record"."""
    return hashlib.sha256("\x1f".join((rule_id, version, topic, text)).encode()).hexdigest()[:32]


def members(rule: dict) -> list[str]:
    """The members a detection of `rule` appends, in the contract's order."""
    out = ["rule_id", "rule_version", "rule_type"]
    if rule.get("name"):
        out.append("rule_name")
    out += ["processed", "detection_id"]
    if rule["rule_type"] == "velocity":
        out += ["aggregation_type", "aggregation_value"]
    elif rule["rule_type"] == "correlation":
        out += ["context_value", "metric", "metric_value"]
        if rule.get("emit_mode", "both") in ("context", "both"):
            out.append("context")
    return out


def same(want: object, got: object) -> bool:
    if isinstance(want, bool) or isinstance(got, bool):
        return want is got
    if isinstance(want, int | float) and isinstance(got, int | float):
        return math.isclose(want, got, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(want, dict) and isinstance(got, dict):
        return want.keys() == got.keys() and all(same(want[k], got[k]) for k in want)
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(same(a, b) for a, b in zip(want, got, strict=True))
    return want == got


def _detection_problems(v: Vector, want: dict, line: str) -> list[str]:
    """Why `line` is not the detection `want` describes (empty: it is)."""
    rec = v.records()[want["event"]]
    rule = v.rule_doc(want["rule_id"])
    rid = v.rule_id(want["rule_id"])
    problems = []
    head = rec.text.rstrip()[:-1]
    if not line.startswith(head):
        return [f"not the text of event {want['event']} with members appended: {line[:200]}"]
    rest = line[len(head):]
    if not rest.startswith("," if head.strip() != "{" else '"'):
        problems.append(f"members not appended to the event's text: {rest[:80]}")
    pairs = json.loads(line, object_pairs_hook=list)
    n_event = len(json.loads(rec.text, object_pairs_hook=list))
    got_order = [k for k, _ in pairs[n_event:]]
    if got_order != members(rule):
        problems.append(f"members {got_order}, the contract's order is {members(rule)}")
    got = json.loads(line)
    expected_id = detection_id(rid, str(rule["version"]), rec.topic, rec.text)
    if got.get("detection_id") != expected_id:
        problems.append(f"detection_id {got.get('detection_id')}, the spec's formula gives {expected_id}")
    for key, value in want.items():
        if key == "event":
            continue
        expected = rid if key == "rule_id" else value
        if key not in got or not same(expected, got[key]):
            problems.append(f"{key}: {got.get(key, '<missing>')!r}, expected {expected!r}")
    if got.get("aggregation_type") in ("count", "distinct_count") and not isinstance(got.get("aggregation_value"), int):
        problems.append(f"aggregation_value {got.get('aggregation_value')!r} is no integer")
    return problems


def check(vectors: list[Vector], engine: str, detections: list[str], dead_letters: list[dict]) -> dict[str, list[str]]:
    """Per vector that runs on `engine`, what its output got wrong (only vectors with a
    problem are keys). `detections`: the sink's records as text; `dead_letters`: the
    dead-letter records (topic, reason, rule_id, raw)."""
    by_prefix: dict[str, list[str]] = {}
    for line in detections:
        by_prefix.setdefault(json.loads(line)["rule_id"].split("_", 1)[0], []).append(line)
    dead_by_prefix: dict[str, list[dict]] = {}
    for d in dead_letters:
        dead_by_prefix.setdefault(d["topic"].split(".", 1)[0], []).append(d)
    out: dict[str, list[str]] = {}
    for v in vectors:
        if not v.runs_on(engine):
            continue
        problems = _check_one(v, by_prefix.get(v.prefix, []), dead_by_prefix.get(v.prefix, []))
        if problems:
            out[v.name] = problems
    return out


def _check_one(v: Vector, lines: list[str], dead: list[dict]) -> list[str]:
    problems: list[str] = []
    expect = v.doc.get("expect", {})
    left = list(lines)
    for want in expect.get("detections", []):
        rid = v.rule_id(want["rule_id"])
        rec = v.records()[want["event"]]
        candidates = [ln for ln in left if json.loads(ln)["rule_id"] == rid and rec.text is not None
                      and ln.startswith(rec.text.rstrip()[:-1])]
        if not candidates:
            problems.append(f"missing: {want['rule_id']} at event {want['event']}")
            continue
        best = min(candidates, key=lambda ln: len(_detection_problems(v, want, ln)))
        problems += [f"{want['rule_id']} at event {want['event']}: {p}" for p in _detection_problems(v, want, best)]
        left.remove(best)
    problems += [f"unexpected detection: {ln[:300]}" for ln in left]
    records = v.records()
    want_dead = Counter()
    for d in expect.get("dead_letters", []):
        rec = records[d["event"]]
        rid = v.rule_id(d["rule_id"]) if d.get("rule_id") else None
        want_dead[(rec.topic, rid, d["reason"], rec.text if rec.value is not None else None)] += 1
    got_dead = Counter()
    for d in dead:
        key_raw = d.get("raw") if any(r.text is not None and r.text == d.get("raw") for r in records) else None
        got_dead[(d["topic"], d.get("rule_id"), d["reason"], key_raw)] += 1
    for key in (want_dead - got_dead):
        problems.append(f"missing dead letter: {key}")
    for key in (got_dead - want_dead):
        problems.append(f"unexpected dead letter: {key}")
    return problems


def format_problems(problems: dict[str, list[str]]) -> str:
    return "\n".join(f"{name}:\n  " + "\n  ".join(ps) for name, ps in sorted(problems.items()))
