"""The floor of any Spark app (bench/start_bench.py): start a session, read one small Parquet file, write one row.

    spark-submit bench/spark_floor.py --input IN.parquet --output OUT_DIR

Prints one JSON line {"rows": N}. Whatever detection does beyond this is its own cost.
"""

from __future__ import annotations

import argparse
import json
import sys

from pyspark.sql import SparkSession


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spark_floor.py")
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)
    spark = SparkSession.builder.appName("fleet-doctor-floor").getOrCreate()
    rows = spark.read.parquet(args.input).count()
    spark.createDataFrame([(rows,)], "rows long").write.mode("overwrite").parquet(args.output)
    print(json.dumps({"rows": rows}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
