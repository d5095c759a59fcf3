"""Four eyes: who may decide a release.

A release is decided (approved or rejected) only by a user who holds an approver role
and who neither authored nor committed any commit of the release, nor, when it puts a
shadow version in force, approved that shadow. Git identities map
to Airflow users by e-mail (case-insensitive): the e-mail of the Airflow user who
responds is compared with the author and committer e-mails of every commit between the
last published commit and the released one (spark_jobs.lifecycle.git.release_authors).

These are plain functions: the api-server enforces them on the approval response
(plugins/rule_lifecycle/four_eyes.py), the approval page states them, and the tests
check them without Airflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def author_emails(authors: Iterable[Mapping]) -> set[str]:
    """Every author and committer e-mail of the release's commits, lower-cased."""
    out = set()
    for a in authors:
        for key in ("email", "committer_email"):
            if a.get(key):
                out.add(str(a[key]).strip().lower())
    return out


def refusal(
    *, username: str, email: str | None, roles: Iterable[str], approver_roles: Iterable[str], authors: Iterable[Mapping] | None,
    promotions: Iterable[Mapping] = (), user_id: str | None = None,
) -> str | None:
    """Why `username` may not decide this release, or None when they may.

    `promotions` (release.shadow_promotions): the shadows the release would put in
    force, with who approved each shadow's release; that approver may not decide the
    promotion too, so a version reaches the sink on the word of two approvers."""
    if not set(roles) & set(approver_roles):
        return (
            f"Four eyes: {username} does not hold an approver role ({', '.join(sorted(approver_roles))}); "
            "only approvers decide a release."
        )
    if authors is None:
        return "Four eyes: the release's commits are not known yet, so no one can be cleared to decide it."
    mine = (email or "").strip().lower()
    if not mine:
        return f"Four eyes: {username} has no e-mail in Airflow, so they cannot be told apart from the authors."
    own = sorted({str(a.get("commit", ""))[:12] for a in authors if mine in author_emails([a])})
    if own:
        return (
            f"Four eyes: {username} <{mine}> authored or committed {', '.join(own)} in this release; "
            "another approver must decide it."
        )
    def approved_shadow(by: Mapping) -> bool:  # Airflow's responded_by_user: id and username
        return by.get("name") == username or (user_id is not None and str(by.get("id")) == str(user_id))

    mine_shadows = sorted(f"{p.get('rule_id')} v{p.get('version')}" for p in promotions
                          if approved_shadow(p.get("shadow_approved_by") or {}))
    if mine_shadows:
        return (
            f"Four eyes: {username} approved {', '.join(mine_shadows)} as a shadow; "
            "its promotion takes a second approver."
        )
    return None
