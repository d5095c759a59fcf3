"""`rulectl`: the command line of the platform.

Each subcommand lives in `spark_jobs.commands.<name>` with a `register(subparsers)`
function, so commands stay small and independent. Exit codes follow the usual
convention: 0 success, 1 the input is invalid / the check failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ["validate", "schema", "backtest", "broker", "cluster", "publish", "detect", "runner", "history", "up", "demo",
            "tail", "archive", "connect", "explain", "shadow"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rulectl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"spark_jobs.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"spark_jobs.commands.{name}":
                continue  # command not shipped in this build
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from spark_jobs.commands.backtest import join_relative_times

    parser = build_parser()
    args = parser.parse_args(join_relative_times(sys.argv[1:] if argv is None else list(argv)))
    if args.command != "up":  # `up` decides its own credentials (it writes them)
        from spark_jobs.kafka.client_config import adopt_platform_credentials

        adopt_platform_credentials()
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
