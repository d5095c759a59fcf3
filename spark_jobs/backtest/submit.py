"""spark-submit entry point of the backtest (what Airflow's SparkSubmitOperator runs):
`spark-submit --master URL spark_jobs/backtest/submit.py --rules ... --input ... --out ...`"""

from __future__ import annotations

import argparse
import sys

from spark_jobs.commands.backtest import add_arguments, join_relative_times, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="backtest")
    add_arguments(parser)
    return run(parser.parse_args(join_relative_times(sys.argv[1:] if argv is None else list(argv))))


if __name__ == "__main__":
    sys.exit(main())
