"""The platform's JVM jars: resolved by Maven from the pinned descriptor beside this file.

Spark's `--packages` (Ivy) ignores Maven's mirror and proxy settings, so the jars are
resolved by Maven itself into a local folder and handed to Spark as `spark.jars` (local
paths) and to the Kafka broker as its classpath. `ensure_jars()` does that once and again
only when a descriptor changes (a stamp holds their hash), under a file lock so that
parallel test workers or commands do not run Maven twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

JARS_ENV = "RULES_JARS_DIR"
_HERE = Path(__file__).resolve().parent
_POMS = (_HERE / "pom.xml", _HERE / "broker" / "pom.xml", _HERE / "spark" / "pom.xml",
         _HERE / "processor" / "pom.xml")
MODULES = ("broker", "spark")
# The live job's JVM keyed operator (module `processor`), built from the Java sources
# beside this file into the `spark` folder, so spark_jars() hands it to Spark.
OPERATOR_SOURCES = _HERE / "processor" / "src"
OPERATOR_JAR = "rule-platform-keyed-operator.jar"


class JarsError(RuntimeError):
    """Maven is missing or could not resolve the pinned jars."""


def jars_dir() -> Path:
    """$RULES_JARS_DIR, else `.jars/` of the source checkout (editable install), else
    the user's cache folder."""
    override = os.environ.get(JARS_ENV)
    if override:
        return Path(override).expanduser().resolve()
    checkout = _HERE.parents[1]
    if (checkout / "pyproject.toml").is_file() and os.access(checkout, os.W_OK):
        return checkout / ".jars"
    return Path.home() / ".cache" / "rule-platform" / "jars"


def _digest() -> str:
    """The descriptors' and the operator's Java sources' hash (its tests' too, which the
    build runs): an edited source rebuilds."""
    h = hashlib.sha256()
    for pom in _POMS:
        h.update(pom.read_bytes())
    for src in sorted(OPERATOR_SOURCES.rglob("*.java")):
        h.update(str(src.relative_to(OPERATOR_SOURCES)).encode() + b"\0")
        h.update(src.read_bytes())
    return h.hexdigest()


def _ready(root: Path, digest: str) -> bool:
    stamp = root / ".stamp"
    return stamp.is_file() and stamp.read_text().strip() == digest and all(
        any((root / m).glob("*.jar")) for m in MODULES
    ) and (root / "spark" / OPERATOR_JAR).is_file()


def ensure_jars(root: Path | None = None) -> Path:
    """The jars folder, with every module's jars present (runs Maven when they are not)."""
    root = root or jars_dir()
    digest = _digest()
    if _ready(root, digest):
        return root
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError("Maven (mvn) is not on PATH: install it (Debian: apt-get install maven) to fetch the jars")
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _ready(root, digest):
            return root
        for module in (*MODULES, ".build"):
            shutil.rmtree(root / module, ignore_errors=True)
        cmd = [mvn, "-q", "-B", "-f", str(_HERE / "pom.xml"), "package", f"-Djars.dir={root}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise JarsError(f"mvn failed ({done.returncode}): {(done.stdout + done.stderr)[-3000:]}")
        (root / ".stamp").write_text(digest)
    return root


def module_jars(module: str, root: Path | None = None) -> list[Path]:
    """The jar files of one module (`broker` or `spark`), resolved if missing."""
    if module not in MODULES:
        raise ValueError(f"unknown jar module {module!r}; one of {MODULES}")
    return sorted((ensure_jars(root) / module).glob("*.jar"))


def spark_jars() -> str:
    """`spark.jars`: Spark's Kafka connector and what it needs, Delta Lake and the JVM
    keyed operator, as local paths."""
    return ",".join(str(p) for p in module_jars("spark"))


def operator_jar() -> Path | None:
    """The platform's own jar where set-up built it, else None (never builds it: a
    session without Kafka must not need Maven). It heads every platform Spark JVM's
    class path (spark_jobs/spark.py, `jvm_options`) because the class archive is
    only valid for the class path it was written with (spark_jobs/jvm/class_archive.py)."""
    path = jars_dir() / "spark" / OPERATOR_JAR
    return path if path.is_file() else None


def broker_classpath() -> str:
    """The Kafka broker's Java classpath."""
    return os.pathsep.join(str(p) for p in module_jars("broker"))
