"""Who may do what on the platform: four roles in Airflow's FAB auth manager, and the
demo users `rulectl up` (and the test fixtures) create.

Roles (FAB roles in the Airflow metadata DB, built on FAB's own permission sets so
they follow Airflow upgrades):

- `Rule viewer`: reads everything a release shows (DAG runs, logs, reports, the
  approval page); cannot respond to an approval, trigger or change anything.
- `Rule author`: a viewer who may also trigger a run of `rule_release` (e.g. of their
  commit).
- `Rule approver`: a viewer who may respond to a `rule_release` approval. The four-eyes rule
  (plugins/rule_lifecycle/four_eyes.py) further refuses an approver who authored or
  committed any commit of the release.
- `Platform operator`: FAB's `Op` permissions (connections, variables, pools, runs);
  not an approver unless also given `Rule approver`.
- `Release service`: the release DAG's own account on the REST API: may set the state
  and note of `rule_release` runs and tasks (to end a superseded release, to note a
  decision on the run), nothing else.

Git identities map to Airflow users by e-mail: the author and committer e-mail of
every commit in a release are compared, case-insensitively, with the `email` of the
Airflow user who responds. An approver's Airflow e-mail must therefore be the one
they commit with.

Provisioning runs inside Airflow's environment (`python -m spark_jobs.platform.identity
USERS_JSON`), through FAB's security manager, so passwords are hashed by FAB and
never pass through a command line.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

# FAB's auth manager, plus HITL steps assigned to a role (spark_jobs/platform/auth.py).
AUTH_MANAGER = "spark_jobs.platform.auth.RulePlatformAuthManager"

VIEWER, AUTHOR, APPROVER, OPERATOR = "Rule viewer", "Rule author", "Rule approver", "Platform operator"
SERVICE = "Release service"
ROLES = (AUTHOR, APPROVER, VIEWER, OPERATOR, SERVICE)
# The account the release DAG uses on Airflow's REST API to end a superseded run
# (connection `rule_lifecycle_api`); not a person, never an approver.
SERVICE_USER = "release-service"
API_CONN_ID = "rule_lifecycle_api"
APPROVER_ROLES = frozenset({APPROVER})
# An `assigned_users` id that stands for every member of a role (spark_jobs/platform/auth.py).
ROLE_PREFIX = "role:"


def assigned_to_role(role: str, label: str | None = None) -> dict[str, str]:
    """A HITL `assigned_users` entry meaning "every member of `role`" (needs the
    platform's auth manager, RulePlatformAuthManager, to be honoured)."""
    return {"id": f"{ROLE_PREFIX}{role}", "name": label or f"{role}s"}
RELEASE_DAG = "rule_release"

# One demo user per role, and a second approver (a shadow's promotion takes an approver
# other than the shadow's): username -> (role, e-mail, display name).
DEMO_USERS: dict[str, tuple[str, str, str]] = {
    "author": (AUTHOR, "author@rules.example", "Rule Author"),
    "approver": (APPROVER, "approver@rules.example", "Rule Approver"),
    "reviewer": (APPROVER, "reviewer@rules.example", "Rule Reviewer"),
    "viewer": (VIEWER, "viewer@rules.example", "Rule Viewer"),
    "operator": (OPERATOR, "operator@rules.example", "Platform Operator"),
}


def role_permissions() -> dict[str, set[tuple[str, str]]]:
    """(action, resource) pairs of each platform role, from FAB's own permission sets."""
    from airflow.providers.fab.auth_manager.security_manager.override import (
        FabAirflowSecurityManagerOverride as SM,
    )
    from airflow.providers.fab.www.security import permissions as p

    # Reading plugin metadata is what makes the UI show the plugin's views (the run's
    # "Backtest report" tab, the "Backtest reports" menu entry): every role needs it.
    viewer = set(SM.VIEWER_PERMISSIONS) | {(p.ACTION_CAN_READ, p.RESOURCE_PLUGIN)}
    # FAB lets a user write a DAG's sub-entity (a run, an approval) only with "can_edit"
    # on the DAG itself: granted on the release DAG alone (its per-DAG resource).
    release_dag = (p.ACTION_CAN_EDIT, p.resource_name(RELEASE_DAG, p.RESOURCE_DAG))
    return {
        VIEWER: viewer,
        AUTHOR: viewer | {release_dag, (p.ACTION_CAN_CREATE, p.RESOURCE_DAG_RUN)},
        APPROVER: viewer
        | {release_dag, (p.ACTION_CAN_EDIT, p.RESOURCE_HITL_DETAIL), (p.ACTION_CAN_ACCESS_MENU, p.RESOURCE_HITL_DETAIL)},
        OPERATOR: viewer | set(SM.USER_PERMISSIONS) | set(SM.OP_PERMISSIONS),
        SERVICE: viewer | {release_dag, (p.ACTION_CAN_EDIT, p.RESOURCE_DAG_RUN), (p.ACTION_CAN_EDIT, p.RESOURCE_TASK_INSTANCE)},
    }


def service_user_spec(password: str) -> dict:
    return {"username": SERVICE_USER, "roles": [SERVICE], "email": "release-service@rules.invalid",
            "first_name": "Release", "last_name": "Service", "password": password}


def api_connection(base_url: str, password: str) -> dict:
    """The `rule_lifecycle_api` connection (LocalFilesystemBackend JSON form)."""
    return {API_CONN_ID: {"conn_type": "http", "host": base_url, "login": SERVICE_USER, "password": password}}


def generate_passwords(usernames: Iterable[str] = DEMO_USERS) -> dict[str, str]:
    return {u: secrets.token_urlsafe(12) for u in usernames}


def write_secret_file(path: Path, data: Mapping) -> Path:
    """Write JSON readable by its owner only (0600 from creation, no umask window)."""
    return write_secret_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def demo_user_specs(passwords: Mapping[str, str]) -> list[dict]:
    """The provisioning input for the demo users (username, role, e-mail, password)."""
    out = []
    for username, (role, email, display) in DEMO_USERS.items():
        first, _, last = display.partition(" ")
        out.append(
            {"username": username, "roles": [role], "email": email, "first_name": first, "last_name": last or "-",
             "password": passwords[username]}
        )
    return out


def provision(users: Iterable[Mapping]) -> list[str]:
    """Create or update the platform roles and the given users in FAB's tables.

    Idempotent: roles get exactly their permissions, existing users their roles,
    e-mail and password. Must run with Airflow's configuration (AIRFLOW_HOME, DB)."""
    from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder

    done = []
    with get_application_builder() as ab:
        sm = ab.sm
        for name, want in role_permissions().items():
            role = sm.find_role(name) or sm.add_role(name)
            have = {(perm.action.name, perm.resource.name): perm for perm in role.permissions}
            for action, resource in sorted(want - set(have)):
                sm.add_permission_to_role(role, sm.get_permission(action, resource) or sm.create_permission(action, resource))
            for key in set(have) - want:
                sm.remove_permission_from_role(role, have[key])
        for spec in users:
            roles = [sm.find_role(r) for r in spec["roles"]]
            if None in roles:
                raise ValueError(f"unknown role in {spec['roles']}")
            user = sm.find_user(username=spec["username"])
            if user is None:
                sm.add_user(
                    spec["username"], spec.get("first_name") or spec["username"], spec.get("last_name") or "-",
                    spec["email"], roles, spec["password"],
                )
            else:
                user.roles, user.email = roles, spec["email"]
                sm.update_user(user)
                sm.reset_password(user.id, spec["password"])
            done.append(spec["username"])
    return done


def write_secret_text(path: Path, text: str) -> Path:
    """Write text readable by its owner only (0600 from creation, no umask window)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    tmp.replace(path)
    return path


def make_docker_secrets(folder: Path) -> list[Path]:
    """The secret files docker/docker-compose.yml needs, generated, each 0600; existing
    files are kept (re-running never rotates a secret by surprise). The SMTP connection
    is a placeholder to fill in with the mail relay's host and credentials.

    Kafka (SASL/SCRAM, spark_jobs/kafka/security.py): `kafka_credentials.json` holds every
    principal (the init container stores the users and ACLs with it); each other
    container gets only its own principal: the nodes the admin's password
    (`kafka_admin_password`), the driver host `kafka_detector.json`, the demo
    `kafka_producer.json`, an operator's `rulectl tail` `kafka_reader.json`, and Airflow
    its Kafka connections (supervisor, publisher) inside `airflow_connections.json`."""
    from cryptography.fernet import Fernet

    from spark_jobs.kafka.client_config import KafkaClientSettings, confluent_config
    from spark_jobs.kafka.security import BrokerSecurity
    from spark_jobs.platform.control import airflow_connections

    folder.mkdir(parents=True, exist_ok=True)
    kafka_file = folder / "kafka_credentials.json"
    written = [] if kafka_file.exists() else [kafka_file]
    kafka_pw = BrokerSecurity.load_or_generate(kafka_file).passwords
    kafka = KafkaClientSettings(credentials_file=str(kafka_file))
    brokers = "kafka-1:19092,kafka-2:19092,kafka-3:19092"
    publisher = {"bootstrap.servers": brokers, **confluent_config("publisher", kafka)}
    service_pw = secrets.token_urlsafe(24)
    values: dict[str, object] = {
        "kafka_admin_password": kafka_pw["admin"],
        "kafka_detector.json": {"detector": kafka_pw["detector"]},
        "kafka_producer.json": {"producer": kafka_pw["producer"]},
        "kafka_reader.json": {"reader": kafka_pw["reader"]},
        "rules_signing_key": secrets.token_urlsafe(32),
        "postgres_password": secrets.token_urlsafe(24),
        "airflow_fernet_key": Fernet.generate_key().decode(),
        "airflow_jwt_secret": secrets.token_urlsafe(48),
        "airflow_secret_key": secrets.token_urlsafe(48),
        "airflow_connections.json": {
            "smtp_default": {"conn_type": "smtp", "host": "smtp.example.com", "port": 587, "login": "", "password": "",
                             "extra": {"from_email": "rule-platform@example.com", "disable_ssl": True}},
            **api_connection("http://airflow-apiserver:8080", service_pw),
            **airflow_connections(brokers, confluent_config("supervisor", kafka)),
            "rules_kafka": {"conn_type": "kafka", "extra": publisher},
        },
        "airflow_users.json": [*demo_user_specs(generate_passwords()), service_user_spec(service_pw)],
    }
    for name, value in values.items():
        path = folder / name
        if path.exists():
            continue
        if isinstance(value, str):
            write_secret_text(path, value)
        else:
            write_secret_file(path, value)  # type: ignore[arg-type]
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """`python -m spark_jobs.platform.identity USERS_JSON`: provision roles and users;
    `... make-docker-secrets DIR`: generate the docker/ stack's secret files."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "make-docker-secrets":
        made = make_docker_secrets(Path(args[1]))
        print(f"wrote {len(made)} secret file(s) (mode 0600) in {args[1]}: {', '.join(p.name for p in made) or 'none new'}")
        return 0
    if len(args) != 1:
        print("usage: python -m spark_jobs.platform.identity USERS_JSON | make-docker-secrets DIR", file=sys.stderr)
        return 2
    users = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    names = provision(users)
    print(f"provisioned roles {', '.join(ROLES)} and user(s) {', '.join(names)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
