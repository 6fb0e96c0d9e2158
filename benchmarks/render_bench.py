"""Write the tables (and plots) of benchmark results files: for a run made with `--no-plots` elsewhere, such
as `benchmarks/gpu.sh` on a device machine whose files come back as JSON only.

    python benchmarks/render_bench.py runs/gpu-sh/gpu-h200*.json --out benchmarks/results [--replace]
    python benchmarks/render_bench.py run2/gpu-h200.json --label b64 --out benchmarks/results

Each file's `<stem>.json`, `<stem>.md` and PNG plots go to --out, as `python -m jax_scan_rnn.bench` writes them.
`--label` renames a run (its file names and the table's preset), e.g. two device runs of the same preset that
measured different batch sizes; the run's original label is kept in its JSON as `config.label_run`.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jax_scan_rnn.bench.report import write_results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results JSON files of the suite")
    parser.add_argument("--out", required=True, help="folder for the JSON, Markdown and PNG files")
    parser.add_argument("--replace", action="store_true", help="write over earlier files of the same name")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--label", help="write the run under this label (one results file only)")
    args = parser.parse_args(argv)
    if args.label and len(args.results) > 1:
        parser.error(f"--label: expected one results file, got {len(args.results)}")
    for path in args.results:
        try:
            results = json.loads(Path(path).read_text(encoding="utf-8"))
            if args.label:
                results["config"]["label_run"] = results["config"]["label"]
                results["config"]["label"] = args.label
            paths = write_results(results, args.out, plots=not args.no_plots, replace=args.replace)
        except (OSError, ValueError, KeyError, FileExistsError) as err:
            print(f"render_bench.py: {path}: {err}", file=sys.stderr)
            return 2
        print(" ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
