"""`rulectl shadow RULE_ID`: what the rule's shadow version would change.

Reads the shadow topic (the shadow version's detections), the sink (the version in
force's) and `rules.active` (when the shadow was published), and prints per hour the
events both detected, only the shadow did and only the version in force did, with
examples (spark_jobs/lifecycle/shadow.py). Next to `rulectl up` it needs no options
(the broker comes from `var/platform.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("shadow", help="a shadow version's detections against the version in force's",
                       description=__doc__.splitlines()[0])
    p.add_argument("rule_id", metavar="RULE_ID")
    p.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: the local platform's)")
    p.add_argument("--sink-topic", default="events.processed")
    p.add_argument("--shadow-topic", default="events.shadow")
    p.add_argument("--rules-topic", default="rules.active")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from spark_jobs.commands.explain import _platform
    from spark_jobs.lifecycle.shadow import read_diff

    bootstrap = args.bootstrap or _platform().get("bootstrap") or os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    result = read_diff(bootstrap, args.rule_id, args.sink_topic, args.shadow_topic, args.rules_topic)
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
        return 0 if result.shadow_version else 1
    if not result.shadow_version:
        print(f"{args.rule_id} has no shadow version on {args.rules_topic}", file=sys.stderr)
        return 1
    t = result.totals
    print(f"{args.rule_id}: shadow v{result.shadow_version} against v{result.current_version or '-'} in force, "
          f"since {result.since}: both {t['both']}, only the shadow {t['only_shadow']}, "
          f"only the version in force {t['only_current']}")
    for h in result.hours:
        c = h.counts
        print(f"  {h.hour}  both {c['both']}  only shadow {c['only_shadow']}  only in force {c['only_current']}")
        for kind in ("only_shadow", "only_current"):
            for ex in h.examples[kind]:
                print(f"      {kind}: {ex[:300]}")
    return 0
