"""The gauges in a real browser: values pushed from a kernel thread while the cell runs move the
meters, and the colour state turns warn then danger as memory nears its limit."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

SHOW = """\
from sandbox_kernel_ext.notebook.gauges import GaugePanel
panel = GaugePanel(limits={"memory_mb": 100, "cpu_seconds": 10, "timeout_seconds": 30,
                           "tokens": 1000, "cost_usd": None})
panel.show()
"""
# Memory climbs 9.5, 19, ... 95 MB of 100: ok below 75 %, warn from 75 %, danger from 90 %.
# The cell then holds until the test has seen the page move, so the updates are seen live.
FEED = """\
import pathlib, threading, time
def feed():
    for i in range(1, 11):
        panel.update({{"cpu_seconds": 0.3 * i, "cpu_percent": 30.0, "memory_mb": 9.5 * i,
                       "peak_memory_mb": 9.5 * i, "elapsed_seconds": 1.0 * i,
                       "tokens_used": 50 * i, "cost_usd": 0.001 * i, "processes": 1}})
        time.sleep(0.15)
feeder = threading.Thread(target=feed)
feeder.start()
feeder.join()
deadline = time.monotonic() + 60
while not pathlib.Path({flag!r}).exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("released")
"""
FREEZE = """\
panel.freeze({"cpu_seconds": 3.0, "memory_mb": 0.0, "peak_memory_mb": 95.0,
              "elapsed_seconds": 10.2, "tokens_used": 500, "cost_usd": 0.01, "processes": 0,
              "egress_allowed": 0, "egress_denied": 2}, outcome="finished")
"""
# Records every change of the memory meter: its value, the row's state and the bar's colour.
WATCH_MEMORY = """(output) => {
  window.gaugeLog = [];
  const record = () => {
    const meter = output.querySelector('[role="meter"][aria-label="Memory"]');
    if (!meter) return;
    const row = meter.closest('[data-gauge]');
    const fill = meter.querySelector('.skx-gauge__fill');
    const entry = {value: Number(meter.getAttribute('aria-valuenow')),
                   state: row.getAttribute('data-state'),
                   colour: getComputedStyle(fill).backgroundColor};
    const last = window.gaugeLog[window.gaugeLog.length - 1];
    if (!last || last.value !== entry.value || last.state !== entry.state) {
      window.gaugeLog.push(entry);
    }
  };
  record();
  new MutationObserver(record).observe(output, {subtree: true, attributes: true,
    attributeFilter: ['aria-valuenow', 'data-state']});
}"""


def dedupe(items: list[Any]) -> list[Any]:
    return [x for i, x in enumerate(items) if i == 0 or items[i - 1] != x]


def test_gauges_move_and_change_colour_while_the_cell_runs(open_notebook: Any) -> None:
    with tempfile.TemporaryDirectory(prefix="gauge-flag-") as folder:
        flag = Path(folder) / "release"
        nb = open_notebook("gauges.ipynb", [SHOW, FEED.format(flag=str(flag)),
                                                          FREEZE])
        nb.run_cell(0)
        nb.wait_cell_done(0)
        memory = nb.output(0).get_by_role("meter", name="Memory", exact=True)
        memory.wait_for()
        assert memory.get_attribute("aria-valuemin") == "0"
        assert memory.get_attribute("aria-valuemax") == "100"
        # A gauge without a limit shows its value but no meter.
        assert nb.output(0).get_by_role("meter", name="Cost", exact=True).count() == 0
        nb.output(0).element_handle().evaluate(WATCH_MEMORY)

        nb.run_cell(1)
        nb.wait_until("the memory gauge to reach 95",
                 lambda: nb.page.evaluate("window.gaugeLog.some(e => e.value === 95)"))
        assert nb.is_running(1), "the page should move while the cell is still running"
        row = nb.output(0).locator('[data-gauge="memory"]')
        assert row.get_attribute("data-state") == "danger"
        text = row.inner_text()  # one line: the value against its limit, and words
        assert "95 MB of 100 MB" in text and "(95%)" not in text and "near limit" in text
        nb.output(0).get_by_role("button", name="details").click()  # the full panel
        text = row.inner_text()
        assert "95 MB of 100 MB (95%)" in text and "near limit" in text  # not colour alone
        flag.touch()
        nb.wait_cell_done(1)

    log = nb.page.evaluate("window.gaugeLog")
    values = [entry["value"] for entry in log]
    assert values == sorted(values) and len(set(values)) >= 5, log
    assert values[-1] == 95
    assert dedupe([entry["state"] for entry in log]) == ["ok", "warn", "danger"], log
    colours = {entry["state"]: entry["colour"] for entry in log}
    assert len(set(colours.values())) == 3, colours
    tokens = nb.output(0).get_by_role("meter", name="Tokens", exact=True)
    assert tokens.get_attribute("aria-valuenow") == "500"
    assert "released" in nb.output(1).inner_text()

    nb.run_cell(2)
    nb.wait_cell_done(2)
    frozen = nb.output(0).locator('.skx-gauges[data-frozen="true"]')
    frozen.wait_for()
    assert frozen.get_by_role("status").inner_text().startswith("Sandbox finished")
    peak = frozen.get_by_role("meter", name="Memory", exact=True)
    assert peak.get_attribute("aria-valuenow") == "95"
