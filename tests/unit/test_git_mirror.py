"""The release's mirror of the rules repository under tasks that sync it at once."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spark_jobs.lifecycle.git import resolve, sync_mirror


def test_tasks_syncing_the_mirror_at_once_all_succeed(tmp_path: Path) -> None:
    """Seen on `rulectl up`: a release sensor's poll and another run's task synced the
    mirror together and one failed on git's config lock. Two spellings of the repository's
    path make every sync write the mirror's config, as a changed repository setting does."""
    repo = tmp_path / "rules-repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "r.yaml").write_text("rule_id: r\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=A", "-c", "user.email=a@example.com", "commit", "-qm", "r"],
                   check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    mirror = tmp_path / "mirror.git"
    sync_mirror(str(repo), mirror)
    spellings = [str(repo), str(repo) + "/"]

    def task(i: int) -> str:
        for j in range(6):
            sync_mirror(spellings[(i + j) % 2], mirror)
        return resolve(mirror, "main")

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(task, range(8))) == [head] * 8
