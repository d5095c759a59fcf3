"""docker/docker-compose.yml without a Docker engine: valid, complete, pinned like the
project, and running the same commands as the one-machine cluster tests."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from spark_jobs.cli import build_parser
from spark_jobs.kafka.broker import EmbeddedBroker
from spark_jobs.kafka.security import BrokerSecurity
from spark_jobs.platform.runner import RunnerConfig, detect_command
from spark_jobs.platform.spark_cluster import LocalSparkCluster, master_command, worker_command

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "docker-compose.yml"
IN_IMAGE = "/opt/rule-platform/"  # where the images put the repository


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _default(text: str) -> str:
    """`${VAR:-default}` -> default, as compose does with VAR unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(text))


def test_the_topology_is_all_there(compose: dict) -> None:
    services = set(compose["services"])
    assert {"kafka-1", "kafka-2", "kafka-3", "spark-master", "spark-worker-1", "spark-worker-2", "detect-runner",
            "postgres", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
            "airflow-triggerer"} <= services
    assert "detect" not in services  # the driver runs under the runner only


def test_every_referenced_file_exists(compose: dict) -> None:
    for name, svc in compose["services"].items():
        build = svc.get("build")
        if build:
            context = (COMPOSE.parent / build["context"]).resolve()
            assert context == ROOT, name
            assert (context / build["dockerfile"]).is_file(), name
            assert (context / f"{build['dockerfile']}.dockerignore").is_file(), name
        for arg in svc.get("command") or []:
            if isinstance(arg, str) and arg.startswith(IN_IMAGE):
                assert (ROOT / arg[len(IN_IMAGE):]).exists(), f"{name}: {arg}"
        for vol in svc.get("volumes") or []:
            src = str(vol).split(":")[0]
            if src.startswith((".", "/")):
                assert (COMPOSE.parent / _default(src)).exists(), f"{name}: {vol}"
    for dockerfile in ("Dockerfile.platform", "Dockerfile.spark"):
        for line in (ROOT / "docker" / dockerfile).read_text().splitlines():
            if line.startswith("COPY ") and "--from" not in line:
                src = line.split()[1]
                assert src == "." or (ROOT / src).exists(), f"{dockerfile}: {line}"


def test_images_follow_the_project_pins(compose: dict) -> None:
    pom = (ROOT / "spark_jobs" / "jvm" / "pom.xml").read_text()
    kafka_version = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom).group(1)
    for n in (1, 2, 3):
        assert _default(compose["services"][f"kafka-{n}"]["image"]) == f"apache/kafka:{kafka_version}"
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pyspark = next(d.split("==")[1] for d in deps if d.startswith("pyspark=="))
    spark_image = _default(compose["x-spark-build"]["args"]["SPARK_IMAGE"])
    assert spark_image.startswith(f"apache/spark:{pyspark}-")
    assert f"apache/spark:{pyspark}-" in (ROOT / "docker" / "Dockerfile.spark").read_text()
    for dockerfile in ("Dockerfile.platform", "Dockerfile.spark"):
        text = (ROOT / "docker" / dockerfile).read_text()
        assert "COPY pyproject.toml" in text and "ensure_jars" in text  # same pins, same Maven descriptor


def test_spark_containers_run_the_local_cluster_commands(compose: dict, tmp_path: Path) -> None:
    s = compose["services"]
    assert s["spark-master"]["command"] == master_command("spark-master", 7077, 8080)
    for n in (1, 2):
        assert s[f"spark-worker-{n}"]["command"] == worker_command(
            "spark://spark-master:7077", f"spark-worker-{n}", 1, "1g", 8081, "/opt/spark/work-dir/worker")
    # ... and those are what `rulectl cluster` / the cluster tests start.
    local = LocalSparkCluster(tmp_path, workers=2, port=7077, webui_port=8080)
    assert local.master.argv == master_command("127.0.0.1", 7077, 8080)
    assert local.workers[0].argv == worker_command("spark://127.0.0.1:7077", "127.0.0.1", 1, "1g", 8081,
                                                   str(tmp_path / "worker-1"))


def _props(env: dict) -> dict[str, str]:
    """The apache/kafka image's KAFKA_* variables as server properties."""
    return {k[len("KAFKA_"):].lower().replace("_", "."): str(v) for k, v in env.items() if k.startswith("KAFKA_")}


def test_kafka_nodes_have_the_local_clusters_properties(compose: dict, tmp_path: Path) -> None:
    voters = compose["services"]["kafka-1"]["environment"]["KAFKA_CONTROLLER_QUORUM_VOTERS"]
    assert voters == "1@kafka-1:19093,2@kafka-2:19093,3@kafka-3:19093"
    for n in (1, 2, 3):
        props = _props(compose["services"][f"kafka-{n}"]["environment"])
        (tmp_path / f"n{n}").mkdir()
        # The one-machine node with SASL/SCRAM and ACLs on, as `rulectl broker` runs it.
        local = EmbeddedBroker(port=19092, host="127.0.0.1", data_dir=tmp_path / f"n{n}", controller_port=19093,
                               node_id=n, quorum_voters=voters, replication=3,
                               security=BrokerSecurity(passwords={"admin": "x"})).server_properties()
        host_specific = {"listeners", "advertised.listeners", "log.dirs", "listener.security.protocol.map",
                         "controller.quorum.bootstrap.servers", "num.partitions",
                         # the admin's JAAS line: from the secret, written by kafka_node.sh
                         "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config"}
        for key, value in local.items():
            if key not in host_specific:
                assert props.get(key) == value, f"kafka-{n}: {key} is {props.get(key)!r}, the local node has {value!r}"
        assert props["min.insync.replicas"] == "2" and props["default.replication.factor"] == "3"
        protocols = dict(kv.split(":") for kv in props["listener.security.protocol.map"].split(","))
        for listener in props["listeners"].split(","):  # every client listener needs SASL
            name = listener.split("://")[0]
            assert name == "CONTROLLER" or protocols[name] == "SASL_PLAINTEXT", f"kafka-{n}: {listener}"


def test_kafka_credentials_come_from_secrets_one_principal_per_client(compose: dict, tmp_path: Path) -> None:
    """No password in the compose file or an environment; each client container holds
    its own principal's credentials only, and the generated secrets are 0600."""
    text = COMPOSE.read_text()
    assert "password=" not in text.lower() and "sasl.password" not in text
    s = compose["services"]
    node = s["kafka-1"]
    assert node["secrets"] == ["kafka_admin_password"] and "kafka_node.sh" in " ".join(node["entrypoint"])
    script = (ROOT / "docker" / "kafka_node.sh").read_text()
    assert "/run/secrets/kafka_admin_password" in script and "--add-scram" in script
    assert "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config" in script
    assert "--command-config" in " ".join(node["healthcheck"]["test"])
    expected = {"platform-init": "kafka_credentials", "detect-runner": "kafka_detector", "demo": "kafka_producer"}
    for name, secret in expected.items():
        assert secret in s[name]["secrets"], name
        assert s[name]["environment"]["KAFKA_CREDENTIALS_FILE"] == f"/run/secrets/{secret}", name
    airflow_env = compose["x-airflow-env"]
    assert not any(k.startswith("AIRFLOW_CONN_") for k in airflow_env)  # connections come from the secret

    from spark_jobs.platform.identity import make_docker_secrets

    made = {p.name: p for p in make_docker_secrets(tmp_path / "secrets")}
    for declared in compose["secrets"].values():
        assert Path(declared["file"]).name in made, declared
    for p in made.values():
        assert p.stat().st_mode & 0o777 == 0o600, p.name
    import json

    everyone = json.loads(made["kafka_credentials.json"].read_text())
    assert json.loads(made["kafka_detector.json"].read_text()) == {"detector": everyone["detector"]}
    assert json.loads(made["kafka_producer.json"].read_text()) == {"producer": everyone["producer"]}
    assert made["kafka_admin_password"].read_text() == everyone["admin"]
    conns = json.loads(made["airflow_connections.json"].read_text())
    assert conns["detect_kafka"]["extra"]["sasl.username"] == "supervisor"
    assert conns["detect_kafka_producer"]["extra"]["sasl.password"] == everyone["supervisor"]
    assert conns["rules_kafka"]["extra"]["sasl.username"] == "publisher"


def test_the_runner_container_runs_what_the_supervision_test_runs(compose: dict) -> None:
    svc = compose["services"]["detect-runner"]
    cmd = svc["command"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert cmd[0] == "rulectl" and scripts["rulectl"] == "spark_jobs.cli:main"  # = python -m spark_jobs.cli
    args = build_parser().parse_args(cmd[1:])
    assert args.command == "runner"
    detect_args = [a for a in args.detect_args if a != "--"]
    launched = detect_command(RunnerConfig(bootstrap=args.bootstrap, detect_args=detect_args))
    assert launched[1:4] == ["-m", "spark_jobs.cli", "detect"]
    detect = build_parser().parse_args(launched[3:])
    assert detect.master == "spark://spark-master:7077"
    assert detect.bootstrap == "kafka-1:19092,kafka-2:19092,kafka-3:19092"
    # The checkpoint is on storage the driver host and every worker see.
    checkpoint = str(detect.checkpoint)
    for name in ("detect-runner", "spark-worker-1", "spark-worker-2"):
        mounts = compose["services"][name].get("volumes") or compose["x-spark-worker"]["volumes"]
        assert any(checkpoint.startswith(str(v).split(":")[1]) for v in mounts), name


def test_compose_config_when_the_docker_cli_can(tmp_path: Path) -> None:
    docker = shutil.which("docker")
    if not docker or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("no `docker compose` CLI here")
    done = subprocess.run([docker, "compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
