"""The rules repository as the release pipeline sees it: a mirror, fetched on demand,
and one read-only checkout per commit.

A bare mirror (`git clone --mirror`, then `git fetch`) works the same for a local path
and a remote URL, never touches the authors' working tree, and lets every task find any
commit it is handed (a task on another worker fetches again if it has to). Checkouts
are `--shared` clones of the mirror detached at the commit: cheap, and real git
repositories, so `rulectl validate --base` can look at the base commit in them.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path


class GitError(RuntimeError):
    pass


def git(cwd: Path | None, *args: str, check: bool = True) -> str:
    cmd = ["git", *(["-C", str(cwd)] if cwd else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    if check and proc.returncode != 0:
        raise GitError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.setdefault("GIT_TERMINAL_PROMPT", "0")  # never hang on a credential prompt in a task
    return env


@contextmanager
def _mirror_lock(mirror: Path) -> Iterator[None]:
    """One writer of the mirror at a time. Several runs' tasks sync it at once (the
    release sensor polls while another run validates); two git processes writing its
    config or refs together make one fail ("could not lock config file")."""
    mirror.parent.mkdir(parents=True, exist_ok=True)
    with mirror.with_name(mirror.name + ".lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes
        yield


def sync_mirror(repo: str, mirror: Path) -> Path:
    """Create or update the bare mirror of `repo`; returns the mirror path."""
    with _mirror_lock(mirror):
        if (mirror / "HEAD").exists():
            if git(mirror, "config", "--get", "remote.origin.url", check=False).strip() != repo:
                git(mirror, "remote", "set-url", "origin", repo)
            git(mirror, "fetch", "--prune", "--quiet", "origin")
        else:
            tmp = mirror.with_name(mirror.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            git(None, "clone", "--mirror", "--quiet", repo, str(tmp))
            tmp.rename(mirror)
    return mirror


def resolve(mirror: Path, ref: str) -> str:
    """Full commit id of a branch name or commit-ish in the mirror."""
    for candidate in (f"refs/heads/{ref}", ref):
        out = git(mirror, "rev-parse", "--verify", "--quiet", f"{candidate}^{{commit}}", check=False).strip()
        if out:
            return out
    raise GitError(f"no commit {ref!r} in {mirror}")


def _exists(mirror: Path, commit: str) -> bool:
    proc = subprocess.run(["git", "-C", str(mirror), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return proc.returncode == 0


@dataclass(frozen=True)
class CommitInfo:
    commit: str
    short: str
    subject: str
    author: str
    committed_at: str

    def to_dict(self) -> dict:
        return asdict(self)


def commit_info(mirror: Path, commit: str) -> CommitInfo:
    out = git(mirror, "log", "-1", "--format=%H%x1f%h%x1f%s%x1f%an <%ae>%x1f%cI", commit).strip()
    full, short, subject, author, when = out.split("\x1f")
    return CommitInfo(full, short, subject, author, when)


def release_authors(mirror: Path, base: str | None, commit: str, path: str) -> list[dict]:
    """Author and committer of every commit in a release, newest first.

    The release is `base..commit` (everything since the last published commit, whatever
    it touched); without a base (the first release), every commit that touched `path`
    up to `commit`; never fewer than the commit itself. The four-eyes rule (spark_jobs.lifecycle.governance) checks the
    approver against all of them."""
    fmt = "--format=%H%x1f%an%x1f%ae%x1f%cn%x1f%ce"
    if base and _exists(mirror, base):
        out = git(mirror, "log", fmt, f"{base}..{commit}")
    else:
        out = git(mirror, "log", fmt, commit, "--", path)
    if not out.strip():  # e.g. an older commit released again: at least its own author
        out = git(mirror, "log", "-1", fmt, commit)
    rows = []
    for line in out.splitlines():
        if not line.strip():
            continue
        sha, name, email, cname, cemail = line.split("\x1f")
        rows.append({"commit": sha, "author": name, "email": email, "committer": cname, "committer_email": cemail})
    return rows


def is_ancestor(mirror: Path, older: str, newer: str) -> bool:
    """Whether `older` is an ancestor of `newer` (so `newer` contains it)."""
    proc = subprocess.run(["git", "-C", str(mirror), "merge-base", "--is-ancestor", older, newer], capture_output=True)
    return proc.returncode == 0


def paths_changed(mirror: Path, base: str, commit: str, path: str) -> bool:
    """Whether anything under `path` differs between two commits."""
    proc = subprocess.run(
        ["git", "-C", str(mirror), "diff", "--quiet", base, commit, "--", path], capture_output=True, text=True
    )
    if proc.returncode not in (0, 1):
        raise GitError(f"git diff {base} {commit}: {proc.stderr.strip()}")
    return proc.returncode == 1


def checkout(mirror: Path, commit: str, dest_root: Path) -> Path:
    """A detached checkout of `commit` under dest_root/<commit>; reused when present."""
    dest = dest_root / commit
    if (dest / ".git").exists() and git(dest, "rev-parse", "HEAD", check=False).strip() == commit:
        return dest
    dest_root.mkdir(parents=True, exist_ok=True)
    tmp = dest_root / f".{commit}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    git(None, "clone", "--shared", "--no-checkout", "--quiet", str(mirror), str(tmp))
    git(tmp, "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def ensure_commit(repo: str, mirror: Path, commit: str) -> None:
    """Make sure the mirror has `commit`, fetching once if it does not."""
    if (mirror / "HEAD").exists() and _exists(mirror, commit):
        return
    sync_mirror(repo, mirror)
    if not _exists(mirror, commit):
        raise GitError(f"commit {commit} is not in {repo}")
