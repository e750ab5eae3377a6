"""What drawing a sandbox's chart costs the kernel, against showing a table of the same data.

In one process, interleaved: the trusted side making safe (`safe_bundle`) a plotly figure, an
Altair (Vega-Lite) chart and a Bokeh plot (its JSON item, checked model by model) of N
points, against a DataFrame's HTML of the same N rows (the
baseline: an isolated frame of about the same data, without a library). Also times the
first Vega-Lite chart of a process (vl-convert-python builds the library once) and reports
the size of each frame as it reaches the page and the saved notebook.

Run: `python benchmarks/bench_charts.py [-n 30] [--points 1000]`. Prints only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

try:
    import sandbox_kernel_ext  # noqa: F401
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import altair as alt
import pandas as pd
import plotly.express as px
from bokeh.embed import json_item
from bokeh.plotting import figure as bokeh_figure

from _common import fmt_ns
from sandbox_kernel_ext.runner.trusted.charts import BOKEH_ITEM_MIME
from sandbox_kernel_ext.runner.trusted.display import safe_bundle


def bundles(points: int) -> dict[str, dict]:
    """The bundles a sandboxed cell would send, as JSON (what crosses)."""
    frame = pd.DataFrame({"x": range(points), "y": [i % 7 for i in range(points)]})
    figure = px.scatter(frame, x="x", y="y")
    with alt.renderers.enable("mimetype"):
        vega, _ = alt.Chart(frame).mark_point().encode(x="x", y="y")._repr_mimebundle_()
    plot = bokeh_figure(tooltips=[("x", "@x"), ("y", "@y")])
    plot.scatter("x", "y", source=frame)
    made = {
        "DataFrame HTML": {"text/html": frame.to_html(), "text/plain": "df"},
        "plotly figure": {"application/vnd.plotly.v1+json": json.loads(figure.to_json()),
                          "text/plain": "Figure"},
        "Altair chart": {**vega, "text/plain": "alt.Chart(...)"},
        "Bokeh plot": {BOKEH_ITEM_MIME: json_item(plot), "text/plain": "figure(...)"},
    }
    return json.loads(json.dumps(made))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30, help="rounds")
    parser.add_argument("--points", type=int, default=1000)
    args = parser.parse_args()
    made = bundles(args.points)
    started = time.perf_counter_ns()
    safe_bundle(made["Altair chart"], {})
    first_vega = time.perf_counter_ns() - started
    times: dict[str, list[int]] = {label: [] for label in made}
    sizes = {label: len(safe_bundle(bundle, {})[0].get("text/html", ""))
             for label, bundle in made.items()}
    for _ in range(args.n):
        for label, bundle in made.items():
            started = time.perf_counter_ns()
            safe_bundle(bundle, {})
            times[label].append(time.perf_counter_ns() - started)
    base = statistics.median(times["DataFrame HTML"])
    print(f"{args.points} points, {args.n} rounds; the first Vega-Lite chart of the process: "
          f"{fmt_ns(first_vega)}")
    for label, samples in times.items():
        median = statistics.median(samples)
        print(f"{label:16} {fmt_ns(median):>10}  {median / base:6.2f}x the table   "
              f"frame {sizes[label] / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
