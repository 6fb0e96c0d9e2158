"""Write the tables (and plots) of benchmark results files: for a run made with `--no-plots` elsewhere, such
as `benchmarks/gpu.sh` on a device machine whose files come back as JSON only.

    python benchmarks/render_bench.py runs/gpu-sh/gpu-h200*.json --out benchmarks/results [--replace]

Each file's `<stem>.json`, `<stem>.md` and PNG plots go to --out, as `python -m jax_scan_rnn.bench` writes them.
"""
from __future__ import annotations

import argparse
import json
import sys

from jax_scan_rnn.bench.report import write_results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results JSON files of the suite")
    parser.add_argument("--out", required=True, help="folder for the JSON, Markdown and PNG files")
    parser.add_argument("--replace", action="store_true", help="write over earlier files of the same name")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = parser.parse_args(argv)
    for path in args.results:
        try:
            results = json.load(open(path))
            paths = write_results(results, args.out, plots=not args.no_plots, replace=args.replace)
        except (OSError, ValueError, KeyError, FileExistsError) as err:
            print(f"render_bench.py: {path}: {err}", file=sys.stderr)
            return 2
        print(" ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
