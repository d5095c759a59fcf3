"""spark-submit entry point of the backtest (what Airflow's SparkSubmitOperator runs):
`spark-submit --master URL spark_jobs/backtest/submit.py --rules ... --input ... --out ...`"""

from __future__ import annotations

import argparse
import sys

from spark_jobs.commands.backtest import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="backtest")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
