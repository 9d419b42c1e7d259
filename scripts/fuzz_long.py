"""Run the decoder fuzz invariant for a long time (1M+ inputs by default).

The CI test (tests/fuzz/test_decoder_fuzz.py) runs 100k inputs through
hypothesis; this drives the same ``check_seed`` directly from a seed counter,
which is faster, and can run for hours:

    .venv/bin/python scripts/fuzz_long.py --count 1000000 --start 0

It prints progress to stderr and one JSON line on stdout at the end
(``{"inputs": ..., "elapsed_s": ..., "failures": [...]}``). A failing seed
reproduces with ``check_seed(seed)``. Exit status 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fuzz.invariant import check_seed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="inputs to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--progress", type=int, default=100_000, help="report every N inputs")
    parser.add_argument("--max-failures", type=int, default=10, help="stop after N failures")
    args = parser.parse_args()

    failures: list[dict[str, object]] = []
    began = time.perf_counter()
    ran = 0
    for seed in range(args.start, args.start + args.count):
        try:
            check_seed(seed)
        except Exception as exc:
            failures.append({"seed": seed, "error": repr(exc)})
            traceback.print_exc()
            if len(failures) >= args.max_failures:
                ran += 1
                break
        ran += 1
        if ran % args.progress == 0:
            elapsed = time.perf_counter() - began
            print(f"{ran:,} inputs, {elapsed:.1f} s, {ran / elapsed:,.0f}/s", file=sys.stderr)
    elapsed = time.perf_counter() - began
    result = {"inputs": ran, "elapsed_s": round(elapsed, 2), "failures": failures}
    print(json.dumps(result))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
