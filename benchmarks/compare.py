#!/usr/bin/env python3
"""Compare two ck_bench results files (benchmarks/results/<gpu>.json) row by row.

usage: python3 benchmarks/compare.py BEFORE.json AFTER.json [--threshold 0.05]

A row is keyed as ck_bench's --filter sees it, "family/kernel/dtype/shape". For every row in both
files this prints the median time before and after and the ratio after / before (below 1: faster),
sorted by ratio, rows slower than 1 + threshold marked SLOWER; then a summary: rows compared, their
geometric-mean ratio, how many are slower, and the rows found in only one file. A row with no
median (the JSON writes null for a non-finite time) is counted apart. Standard library only.
Exit status: 0 whatever the comparison finds, 1 a file that cannot be read as ck_bench results,
2 bad arguments.
"""
import argparse
import json
import math
import sys


def load_medians(path):
    """{row key: median time in us (None where the file has none)}, and the file's header."""
    try:
        with open(path) as f:
            results = json.load(f)
        medians = {}
        for family in results["families"]:
            for r in family["rows"]:
                key = "/".join((r["family"], r["kernel"], r["dtype"], r["shape"]))
                median = r["time_us"]["median"]
                medians[key] = median if isinstance(median, (int, float)) and median > 0 else None
        return medians, results
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"compare.py: cannot read {path} as ck_bench results: {type(e).__name__}: {e}")


def describe(path, results):
    gpu = results.get("gpu", {}).get("name", "?")
    quick = " (--quick)" if results.get("quick") else ""
    return f"{path}: {gpu}, {results.get('date_utc', '?')}{quick}"


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", help="results JSON of the reference run")
    parser.add_argument("after", help="results JSON of the run to judge")
    parser.add_argument("--threshold", type=float, default=0.05,
                        help="a row is slower when after / before > 1 + THRESHOLD (default 0.05)")
    args = parser.parse_args()

    before, before_results = load_medians(args.before)
    after, after_results = load_medians(args.after)
    print("before " + describe(args.before, before_results))
    print("after  " + describe(args.after, after_results))

    common = [k for k in before if k in after]
    timed = [(after[k] / before[k], k) for k in common if before[k] and after[k]]
    timed.sort()
    limit = 1 + args.threshold
    print(f"\n{'before us':>12} {'after us':>12} {'ratio':>7}  row")
    for ratio, key in timed:
        flag = "  SLOWER" if ratio > limit else ""
        print(f"{before[key]:12.2f} {after[key]:12.2f} {ratio:7.3f}  {key}{flag}")

    no_time = [k for k in common if not (before[k] and after[k])]
    only_before = [k for k in before if k not in after]
    only_after = [k for k in after if k not in before]
    geomean = math.exp(sum(math.log(r) for r, _ in timed) / len(timed)) if timed else math.nan
    print("\nsummary")
    for label, value in (("rows compared", len(timed)),
                         ("geometric-mean ratio", f"{geomean:.3f} (after / before)"),
                         (f"slower than {limit:g}x", sum(r > limit for r, _ in timed)),
                         ("in both, no time in one", len(no_time)),
                         ("only in before", len(only_before)),
                         ("only in after", len(only_after))):
        print(f"  {label + ':':<26}{value}")
    for label, keys in (("no time", no_time), ("only in before", only_before),
                        ("only in after", only_after)):
        for key in keys:
            print(f"    {label}: {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
