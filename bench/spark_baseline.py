"""Baseline Spark apps for the detection benchmark: the least work any detection over the staged probe output does.

    spark-submit bench/spark_baseline.py --mode text  --probe-dir DIR   # read every JSON line (gzip included) and
                                                                        # count them and the Parquet rows
    spark-submit bench/spark_baseline.py --mode parse --probe-dir DIR   # also parse every line with its kind's
                                                                        # schema, as detection does; read every
                                                                        # Parquet column it reads, fold all fields
                                                                        # into one hash sum

Both print one JSON line {"mode", "rows", "checksum"}. They read the files exactly as spark_apps/detect.py does
(``spark.read.text`` over the ``broker_id=<N>/*.jsonl*``, the segment, partition and file records from their
``*.parquet``, detection.read_staged), with
the same Spark configuration, so the JVM start-up, file listing and decompression are in the baseline too.
"""

from __future__ import annotations

import argparse
import json
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from fleet_doctor.detect.frames import STAGED_PARQUET, parse_probe_lines, read_staged


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spark_baseline.py")
    p.add_argument("--mode", choices=("text", "parse"), required=True)
    p.add_argument("--probe-dir", required=True)
    args = p.parse_args(argv)
    spark = SparkSession.builder.appName(f"fleet-doctor-baseline-{args.mode}").getOrCreate()
    raw = spark.read.option("pathGlobFilter", "*.jsonl*").text(args.probe_dir)
    staged = [read_staged(spark, args.probe_dir, kind) for kind in STAGED_PARQUET]
    if args.mode == "text":
        rows, checksum = raw.count() + sum(df.count() for df in staged), None
    else:
        # parsed as detection parses (each line with its kind's schema); every field feeds the hash, so no field
        # can be pruned from the parse
        rec = parse_probe_lines(raw)
        rows = checksum = 0
        for df in (rec, *staged):
            row = df.select(F.count("*").alias("n"), F.sum(F.hash(*df.columns)).alias("h")).collect()[0]
            rows, checksum = rows + row.n, checksum + (row.h or 0)
    print(json.dumps({"mode": args.mode, "rows": rows, "checksum": checksum}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
