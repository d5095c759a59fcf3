"""Signed rule records: only the release path can put a rule in front of the job.

The publisher adds a header `rule_signature` = HMAC-SHA256 over the record's key and
value (the rule id and its canonical JSON) with a key that only the publisher and the
detection job hold. The job's registry (spark_jobs/streaming/registry.py) refuses, reports
and ignores a record whose signature is missing or wrong. Broker ACLs are the first line
(who may write `rules.active`); the signature keeps a mis-configured broker (ACLs off,
a shared superuser) from silently opening the job to any producer.

The key comes from `RULES_SIGNING_KEY_FILE` (a file readable by its owner only; `rulectl
up` generates one per workdir) or `RULES_SIGNING_KEY`. Without either, records are
neither signed nor checked (the behaviour before signing existed).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

HEADER = "rule_signature"
KEY_FILE_ENV = "RULES_SIGNING_KEY_FILE"
KEY_ENV = "RULES_SIGNING_KEY"


def key_from_env(environ: dict[str, str] | None = None) -> bytes | None:
    env = os.environ if environ is None else environ
    path = env.get(KEY_FILE_ENV)
    if path:
        return Path(path).read_text(encoding="utf-8").strip().encode()
    value = env.get(KEY_ENV)
    return value.encode() if value else None


def ensure_key_file(path: Path) -> Path:
    """A key file (0600 from creation), generated once and kept."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(secrets.token_urlsafe(32))
    return path


def sign(key: bytes, record_key: bytes | None, value: bytes | None) -> str:
    """Hex HMAC-SHA256 over the record key and value (length-prefixed: unambiguous)."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in (record_key or b"", value or b""):
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac.hexdigest()


def verify(key: bytes, record_key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]] | None) -> str | None:
    """None when the record carries a valid signature, else why not."""
    given = [v for k, v in (headers or []) if k == HEADER]
    if not given:
        return "unsigned rule record refused: no rule_signature header (not produced by the release path)"
    expected = sign(key, record_key, value)
    if not any(hmac.compare_digest(expected.encode(), (g or b"").strip()) for g in given):
        return "forged rule record refused: rule_signature does not match (not produced by the release path)"
    return None
