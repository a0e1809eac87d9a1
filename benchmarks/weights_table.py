"""Weights per rank of the presets with a published parameter count
(tests/data/published_params.json), at tp 1 and tp 8, next to that count.
Pure arithmetic from the bundled configs, no timing.

    python benchmarks/weights_table.py
"""

from __future__ import annotations

import json
from pathlib import Path

from kvpool.models.weights import Parallel, model_weights
from kvpool.presets import load_model_config
from kvpool.spec.defaults import with_defaults
from kvpool.units import format_bytes

PUBLISHED = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_params.json"


def main() -> None:
    rows = [m for m in json.loads(PUBLISHED.read_text())["models"] if "preset" in m]
    print(f"{'preset':26} {'published':>10} {'counted':>10} {'diff':>7} {'tp 1':>11} {'tp 8 / rank':>12}")
    for m in rows:
        weights = model_weights(with_defaults(load_model_config(m["preset"])))
        published, counted = m["published_params"], weights.parameters
        if counted is None:  # a header sum without a count: not this table's case
            continue
        print(
            f"{m['preset']:26} {published / 1e9:9.2f}B {counted / 1e9:9.3f}B {100 * (counted / published - 1):+6.2f}%"
            f" {format_bytes(weights.per_rank_bytes(Parallel())):>11} {format_bytes(weights.per_rank_bytes(Parallel(tp=8))):>12}"
        )


if __name__ == "__main__":
    main()
