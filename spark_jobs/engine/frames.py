"""Unions of many DataFrames as a balanced tree.

A rule set's plan unions one branch per rule group (emits, dead letters, counts) and one
per recorded topic. Chained, a hundred unions nest the plan a hundred levels deep, past
the depth a Spark Connect client's protobuf decodes (100); balanced, they nest log2(n).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame


def union_all(frames: Sequence[DataFrame]) -> DataFrame:
    """The union (by name) of `frames`, at least one."""
    level = list(frames)
    if not level:
        raise ValueError("union_all of no DataFrame")
    while len(level) > 1:
        level = [level[i].unionByName(level[i + 1]) if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
    return level[0]
