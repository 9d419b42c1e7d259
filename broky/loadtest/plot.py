"""``broky bench --plot``: latency percentiles and throughput over time.

matplotlib is an optional extra (``pip install 'broky[plot]'``), imported
only when a plot is asked for.
"""

from __future__ import annotations

import itertools
from typing import Any


def require_matplotlib() -> None:
    """Raise SystemExit with the install hint if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401, PLC0415 - optional extra, imported on demand
    except ImportError:
        raise SystemExit("broky bench --plot needs matplotlib: pip install 'broky[plot]'") from None


def plot(results: list[dict[str, Any]], path: str) -> None:
    """Write a PNG: throughput over time per target, and (for the latency
    scenario) latency by percentile on a log 1/(1-p) axis."""
    require_matplotlib()
    import matplotlib  # noqa: PLC0415 - optional extra, imported on demand

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - after choosing the Agg backend

    latency = [result for result in results if "_distribution" in result]
    columns = 2 if latency else 1
    figure, axes = plt.subplots(1, columns, figsize=(6 * columns, 4), squeeze=False)
    throughput = axes[0][0]
    for result in results:
        timeline = result["_timeline"]
        times, published, delivered = [], [], []
        for (t0, sent0, got0), (t1, sent1, got1) in itertools.pairwise(timeline):
            times.append(t1)
            published.append((sent1 - sent0) / (t1 - t0))
            delivered.append((got1 - got0) / (t1 - t0))
        throughput.plot(times, published, label=f"{result['target']} published", linestyle="--")
        throughput.plot(times, delivered, label=f"{result['target']} delivered")
    throughput.set_xlabel("seconds")
    throughput.set_ylabel("messages/s")
    throughput.set_title(f"throughput: {results[0]['scenario']}")
    throughput.legend(fontsize="small")
    throughput.grid(alpha=0.3)
    if latency:
        axis = axes[0][1]
        for result in latency:
            pairs = [(p, us) for p, us in result["_distribution"] if p < 100]
            axis.plot([1 / (1 - p / 100) for p, _ in pairs], [us for _, us in pairs],
                      label=result["target"])  # fmt: skip
        ticks = [(2, "50%"), (10, "90%"), (100, "99%"), (1000, "99.9%"), (10000, "99.99%")]
        axis.set_xscale("log")
        axis.set_xticks([t for t, _ in ticks], [label for _, label in ticks])
        axis.set_xlabel("percentile")
        axis.set_ylabel("latency (µs)")
        rate = results[0]["offered_per_s"]
        axis.set_title(f"latency at {rate:,} msg/s" if isinstance(rate, int) else "latency")
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
