"""Four eyes without Airflow: who wrote a release (from a real git repository) and who
may therefore decide it. The api-server applies the same rule
(plugins/rule_lifecycle/four_eyes.py); tests/integration/test_airflow_release.py checks
it end to end in a browser."""

from __future__ import annotations

import subprocess
from pathlib import Path

from spark_jobs.lifecycle.git import release_authors
from spark_jobs.lifecycle.governance import refusal

APPROVERS = {"Rule approver"}


def _commit(repo: Path, name: str, email: str, msg: str, committer: tuple[str, str] | None = None) -> str:
    (repo / "rules").mkdir(exist_ok=True)
    (repo / "rules" / f"{msg}.yaml").write_text(msg)
    cname, cemail = committer or (name, email)
    env = {"GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_COMMITTER_NAME": cname,
           "GIT_COMMITTER_EMAIL": cemail, "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", msg], check=True, env=env)
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, env=env,
                          capture_output=True, text=True).stdout.strip()


def test_release_authors_are_every_author_and_committer_since_the_base(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    base = _commit(repo, "Old Timer", "old@example.com", "a")
    c1 = _commit(repo, "Rita", "rita@example.com", "b")
    c2 = _commit(repo, "Carol", "Carol@Example.com", "c", committer=("Merge Bot", "bot@example.com"))
    rows = release_authors(repo / ".git", base, c2, "rules")
    assert [r["commit"] for r in rows] == [c2, c1]  # not the base's author
    assert {(r["email"], r["committer_email"]) for r in rows} == {
        ("rita@example.com", "rita@example.com"), ("Carol@Example.com", "bot@example.com")}
    # The first release (no base): everyone who touched rules/.
    assert {r["email"] for r in release_authors(repo / ".git", None, c2, "rules")} == {
        "old@example.com", "rita@example.com", "Carol@Example.com"}
    # An older commit released again: at least its own author.
    assert [r["commit"] for r in release_authors(repo / ".git", c2, c1, "rules")] == [c1]


def test_only_an_approver_who_wrote_nothing_of_the_release_may_decide() -> None:
    authors = [{"commit": "c" * 40, "email": "Carol@Example.com", "committer_email": "bot@example.com"}]

    def why(name: str, email: str | None, roles: list[str], who=authors) -> str | None:
        return refusal(username=name, email=email, roles=roles, approver_roles=APPROVERS, authors=who)

    assert why("alice", "alice@example.com", ["Rule approver"]) is None
    carol = why("carol", "carol@example.com", ["Rule approver"])  # e-mails compare case-insensitively
    assert carol and "Four eyes" in carol and "cccccccccccc" in carol and "another approver" in carol
    assert why("bot", "BOT@example.com", ["Rule approver"])  # the committer too
    assert "approver role" in why("oscar", "oscar@example.com", ["Platform operator", "Admin"])
    assert why("alice", None, ["Rule approver"])  # no e-mail: cannot be cleared
    assert why("alice", "alice@example.com", ["Rule approver"], None)  # authors unknown: fail closed


def test_docker_secrets_are_generated_owner_only_and_never_rotated(tmp_path: Path) -> None:
    import json

    from spark_jobs.platform.identity import make_docker_secrets

    made = make_docker_secrets(tmp_path / "secrets")
    names = {p.name for p in made}
    assert names == {"rules_signing_key", "postgres_password", "airflow_fernet_key", "airflow_jwt_secret", "airflow_secret_key",
                     "airflow_connections.json", "airflow_users.json",
                     # Kafka's SASL/SCRAM principals: all of them (platform-init), the broker
                     # admin's, and one file per container role.
                     "kafka_credentials.json", "kafka_admin_password", "kafka_detector.json", "kafka_producer.json",
                     "kafka_reader.json"}
    for p in made:
        assert p.stat().st_mode & 0o777 == 0o600
    users = json.loads((tmp_path / "secrets" / "airflow_users.json").read_text())
    # Two approvers: a shadow's promotion takes one other than the shadow's.
    assert sorted(u["roles"][0] for u in users) == [
        "Platform operator", "Release service", "Rule approver", "Rule approver", "Rule author", "Rule viewer"]
    before = (tmp_path / "secrets" / "airflow_jwt_secret").read_text()
    assert make_docker_secrets(tmp_path / "secrets") == []
    assert (tmp_path / "secrets" / "airflow_jwt_secret").read_text() == before
    # The compose file takes every one of them from these files, and has no default password left.
    compose = (Path(__file__).resolve().parents[2] / "docker" / "docker-compose.yml").read_text()
    for name in names - {"kafka_reader.json"}:  # that one is an operator's (rulectl tail), no container's
        assert f"./secrets/{name}" in compose
    for weak in ("admin:admin", "change-me", "POSTGRES_PASSWORD:-", "AIRFLOW_ADMIN_PASSWORD"):
        assert weak not in compose


def test_the_approver_of_a_shadow_may_not_decide_its_promotion() -> None:
    from spark_jobs.lifecycle.release import shadow_promotions

    authors = [{"commit": "c" * 40, "email": "carol@example.com"}]
    live = {"fraud": {"rule_id": "fraud", "version": "2"}, "fraud@shadow": {"rule_id": "fraud", "version": "3"},
            "spam": {"rule_id": "spam", "version": "1"}, "spam@shadow": {"rule_id": "spam", "version": "4"}}
    validation = {"changed_rule_ids": ["fraud", "spam"],
                  "rules": {"fraud": {"version": "3"}, "spam": {"version": "5"}}}
    records = [
        {"event": "published", "rules": [{"rule_id": "fraud", "mode": "shadow", "version": "3"}],
         "approved_by": {"id": "7", "name": "dave"}},
        {"event": "rejected", "rules": [{"rule_id": "fraud", "mode": "shadow", "version": "3"}],
         "approved_by": None, "decided_by": {"id": "8", "name": "erin"}},
    ]
    # fraud v3 is what its shadow runs: a promotion, released as a shadow by dave; spam
    # v5 is not its shadow's v4.
    promotes = shadow_promotions(validation, live, records)
    assert promotes == [{"rule_id": "fraud", "version": "3", "shadow_approved_by": {"id": "7", "name": "dave"}}]

    def why(name: str) -> str | None:
        return refusal(username=name, email=f"{name}@example.com", roles=["Rule approver"], approver_roles=APPROVERS,
                       authors=authors, promotions=promotes)

    dave = why("dave")
    assert dave == "Four eyes: dave approved fraud v3 as a shadow; its promotion takes a second approver."
    assert why("erin") is None  # who rejected a release of it is no shadow's approver
    # The same Airflow user (by id) under another name is still the shadow's approver.
    assert refusal(username="david", email="david@example.com", roles=["Rule approver"], approver_roles=APPROVERS,
                   authors=authors, promotions=promotes, user_id="7")
    assert why("alice") is None
    # A release of a version its shadow does not run promotes nothing.
    assert shadow_promotions({"changed_rule_ids": ["spam"], "rules": {"spam": {"version": "5"}}}, live, records) == []
