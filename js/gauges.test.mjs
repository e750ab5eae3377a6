// Unit tests of the gauges view: `node --test js/` (node 20's own runner, no npm packages).
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import widget, {
  formatCost,
  formatCount,
  formatMegabytes,
  formatSeconds,
  gaugeSpecs,
  gaugeState,
  ratio,
  statusLine,
  WAIT_WORDS,
} from "./gauges.js";

const LIMITS = {
  memory_mb: 200, cpu_seconds: 10, timeout_seconds: 20, tokens: 1000, cost_usd: 0.5,
};

function snapshot(overrides = {}) {
  return {
    cpu_seconds: 1,
    cpu_percent: 50,
    memory_mb: 20,
    peak_memory_mb: 40,
    elapsed_seconds: 2,
    tokens_used: 0,
    cost_usd: 0,
    processes: 1,
    ...overrides,
  };
}

const byKey = (specs, key) => specs.find((s) => s.key === key);

describe("pure logic", () => {
  it("ratio is null without a usable limit", () => {
    assert.equal(ratio(5, null), null);
    assert.equal(ratio(5, 0), null);
    assert.equal(ratio(null, 10), null);
    assert.equal(ratio(5, 10), 0.5);
    assert.equal(ratio(15, 10), 1.5);
  });

  it("state follows the thresholds at their exact edges", () => {
    assert.equal(gaugeState(74.9, 100), "ok");
    assert.equal(gaugeState(75, 100), "warn");
    assert.equal(gaugeState(89.9, 100), "warn");
    assert.equal(gaugeState(90, 100), "danger");
    assert.equal(gaugeState(150, 100), "danger");
    assert.equal(gaugeState(150, null), "none");
    assert.equal(gaugeState(5, 10, { warn: 0.4, danger: 0.6 }), "warn");
  });

  it("formats numbers the way the text repr does", () => {
    assert.equal(formatSeconds(0.054), "0.05 s");
    assert.equal(formatSeconds(12.34), "12.3 s");
    assert.equal(formatSeconds(125), "2 min 05 s");
    assert.equal(formatMegabytes(3.14), "3.1 MB");
    assert.equal(formatMegabytes(256), "256 MB");
    assert.equal(formatMegabytes(2048), "2.00 GB");
    assert.equal(formatCount(1234567), "1,234,567");
    assert.equal(formatCost(0.01234), "$0.0123");
    assert.equal(formatCost(12.5), "$12.50");
    assert.equal(formatSeconds(undefined), "—");
  });

  it("specs carry value, limit, percent and words for every gauge", () => {
    const specs = gaugeSpecs(snapshot({ memory_mb: 185, tokens_used: 800 }), LIMITS);
    assert.deepEqual(specs.map((s) => s.key), ["cpu", "memory", "elapsed", "tokens", "cost"]);
    const memory = byKey(specs, "memory");
    assert.equal(memory.value, 185);
    assert.equal(memory.max, 200);
    assert.equal(memory.state, "danger");
    assert.equal(memory.words, "near limit");
    assert.equal(memory.text, "185 MB of 200 MB (93%) · peak 40 MB");
    assert.equal(memory.peakPercent, 20);
    const tokens = byKey(specs, "tokens");
    assert.equal(tokens.state, "warn");
    assert.equal(tokens.words, "high");
    assert.match(tokens.ariaText, /800 of 1,000 \(80%\), high/);
    const cpu = byKey(specs, "cpu");
    assert.equal(cpu.text, "1.0 s of 10.0 s (10%) · 50% now");
    assert.equal(cpu.state, "ok");
    assert.equal(cpu.words, "");
  });

  it("a gauge without a limit has no max and no state colour", () => {
    const specs = gaugeSpecs(snapshot({ tokens_used: 5000 }), { ...LIMITS, tokens: null });
    const tokens = byKey(specs, "tokens");
    assert.equal(tokens.max, null);
    assert.equal(tokens.percent, null);
    assert.equal(tokens.state, "none");
    assert.equal(tokens.text, "5,000");
  });

  it("an over-limit value fills the bar and says so", () => {
    const elapsed = byKey(gaugeSpecs(snapshot({ elapsed_seconds: 25 }), LIMITS), "elapsed");
    assert.equal(elapsed.percent, 100);
    assert.equal(elapsed.words, "at limit");
    assert.match(elapsed.text, /\(125%\)/);
  });

  it("frozen specs show peak memory and the status line shows the outcome", () => {
    const usage = snapshot({
      memory_mb: 0, peak_memory_mb: 170, egress_allowed: 2, egress_denied: 1,
    });
    const memory = byKey(gaugeSpecs(usage, LIMITS, { frozen: true }), "memory");
    assert.equal(memory.label, "Memory");
    assert.equal(memory.text, "peak 170 MB of 200 MB (85%)");
    assert.equal(memory.value, 170);
    const cpu = byKey(gaugeSpecs(usage, LIMITS, { frozen: true }), "cpu");
    assert.equal(cpu.text, "1.0 s of 10.0 s (10%)", "a finished run has no momentary rate");
    assert.equal(memory.state, "warn");
    assert.equal(statusLine(usage, ""), "Sandbox running…");
    assert.equal(
      statusLine(usage, "killed: timeout after 5 s"),
      "Sandbox killed: timeout after 5 s · 1 process(es) · egress 2 allowed, 1 denied",
    );
    assert.equal(
      statusLine({ ...usage, peak_processes: 3 }, "finished"),
      "Sandbox finished · 3 process(es) at peak · egress 2 allowed, 1 denied",
    );
  });

  it("time spent waiting for a person is shown apart from the counted elapsed time", () => {
    const waiting = byKey(gaugeSpecs(snapshot({ approval_wait_seconds: 3.5 }), LIMITS), "elapsed");
    assert.equal(waiting.text, `2.0 s of 20.0 s (10%) · 3.5 s ${WAIT_WORDS}`);
    const none = byKey(gaugeSpecs(snapshot({ approval_wait_seconds: 0 }), LIMITS), "elapsed");
    assert.equal(none.text, "2.0 s of 20.0 s (10%)");
  });

  it("missing readings render as a dash, not as zero", () => {
    const cpu = byKey(gaugeSpecs({}, LIMITS), "cpu");
    assert.equal(cpu.value, null);
    assert.equal(cpu.state, "ok");
    assert.equal(cpu.text, "— of 10.0 s (—)");
  });
});

// ---- a DOM just big enough for render(): elements, attributes, text, style -------------

class FakeElement {
  constructor(doc, tag) {
    this.ownerDocument = doc;
    this.tagName = tag.toUpperCase();
    this.children = [];
    this.attributes = new Map();
    this.style = {};
    this.className = "";
    this._text = "";
    this.listeners = new Map();
  }
  addEventListener(type, cb) {
    this.listeners.set(type, [...(this.listeners.get(type) ?? []), cb]);
  }
  click() {
    for (const cb of this.listeners.get("click") ?? []) cb();
  }
  appendChild(node) {
    this.children.push(node);
    node.parentNode = this;
    return node;
  }
  removeChild(node) {
    const i = this.children.indexOf(node);
    assert.notEqual(i, -1, "removeChild of a node that is not a child");
    this.children.splice(i, 1);
    node.parentNode = null;
    return node;
  }
  setAttribute(name, value) {
    this.attributes.set(name, String(value));
  }
  getAttribute(name) {
    return this.attributes.has(name) ? this.attributes.get(name) : null;
  }
  set textContent(value) {
    this.children = [];
    this._text = String(value);
  }
  get textContent() {
    return this._text + this.children.map((c) => c.textContent).join("");
  }
  *walk() {
    yield this;
    for (const c of this.children) yield* c.walk();
  }
  find(predicate) {
    return [...this.walk()].filter(predicate);
  }
}

class FakeDocument {
  createElement(tag) {
    return new FakeElement(this, tag);
  }
}

/** A model with anywidget's get/on/off and a set() that fires change events like Backbone. */
class FakeModel {
  constructor(state) {
    this.state = { ...state };
    this.handlers = new Map();
  }
  get(name) {
    return this.state[name];
  }
  on(event, cb) {
    if (!this.handlers.has(event)) this.handlers.set(event, new Set());
    this.handlers.get(event).add(cb);
  }
  off(event, cb) {
    this.handlers.get(event)?.delete(cb);
  }
  set(name, value) {
    this.state[name] = value;
    for (const cb of this.handlers.get(`change:${name}`) ?? []) cb();
  }
  listenerCount() {
    return [...this.handlers.values()].reduce((n, s) => n + s.size, 0);
  }
}

function mount(state) {
  const el = new FakeDocument().createElement("div");
  const model = new FakeModel({ outcome: "", thresholds: { warn: 0.75, danger: 0.9 }, ...state });
  const cleanup = widget.render({ model, el });
  const meter = (label) =>
    el.find((n) => n.getAttribute("role") === "meter" && n.getAttribute("aria-label") === label)[0];
  const row = (key) => el.find((n) => n.getAttribute("data-gauge") === key)[0];
  return { el, model, cleanup, meter, row };
}

describe("render", () => {
  it("exposes one meter per limited gauge with ARIA values and visible text", () => {
    const { el, meter, row } = mount({ limits: LIMITS, readings: snapshot() });
    const meters = el.find((n) => n.getAttribute("role") === "meter");
    assert.deepEqual(
      meters.map((m) => m.getAttribute("aria-label")),
      ["CPU", "Memory", "Elapsed", "Tokens", "Cost"],
    );
    const memory = meter("Memory");
    assert.equal(memory.getAttribute("aria-valuemin"), "0");
    assert.equal(memory.getAttribute("aria-valuemax"), "200");
    assert.equal(memory.getAttribute("aria-valuenow"), "20");
    assert.match(row("memory").textContent, /20 MB of 200 MB \(10%\)/);
    assert.equal(row("memory").getAttribute("data-state"), "ok");
  });

  it("moves and changes state when the model's readings change", () => {
    const { model, meter, row } = mount({ limits: LIMITS, readings: snapshot() });
    model.set("readings", snapshot({ memory_mb: 160 }));
    assert.equal(meter("Memory").getAttribute("aria-valuenow"), "160");
    assert.equal(row("memory").getAttribute("data-state"), "warn");
    assert.match(row("memory").textContent, /high/);
    model.set("readings", snapshot({ memory_mb: 195 }));
    assert.equal(row("memory").getAttribute("data-state"), "danger");
    const fill = meter("Memory").children.find((c) => c.className === "skx-gauge__fill");
    assert.equal(fill.style.width, "97.5%");
  });

  it("shows no bar for a gauge without a limit, and adds one when a limit arrives", () => {
    const { model, meter, row } = mount({
      limits: { ...LIMITS, cost_usd: null },
      readings: snapshot({ cost_usd: 0.25 }),
    });
    assert.equal(meter("Cost"), undefined);
    assert.match(row("cost").textContent, /\$0\.2500/);
    model.set("limits", LIMITS);
    assert.equal(meter("Cost").getAttribute("aria-valuenow"), "0.25");
    model.set("limits", { ...LIMITS, cost_usd: null });
    assert.equal(meter("Cost"), undefined);
  });

  it("clamps aria-valuenow to the maximum while the text tells the real value", () => {
    const { meter, row } = mount({ limits: LIMITS, readings: snapshot({ elapsed_seconds: 30 }) });
    assert.equal(meter("Elapsed").getAttribute("aria-valuenow"), "20");
    assert.match(row("elapsed").textContent, /30\.0 s of 20\.0 s \(150%\)at limit/);
  });

  it("freezes into a summary when the outcome is set", () => {
    const { el, model, meter } = mount({ limits: LIMITS, readings: snapshot() });
    model.set("readings", snapshot({ memory_mb: 1, peak_memory_mb: 150 }));
    model.set("outcome", "finished");
    const root = el.find((n) => n.className.split(" ").includes("skx-gauges"))[0];
    assert.equal(root.getAttribute("data-frozen"), "true");
    assert.equal(meter("Memory").getAttribute("aria-valuenow"), "150");
    assert.match(meter("Memory").getAttribute("aria-valuetext"), /^peak 150 MB/);
    const status = el.find((n) => n.getAttribute("role") === "status")[0];
    assert.match(status.textContent, /^Sandbox finished/);
  });

  it("is one line until its toggle opens the full panel, which stays open", () => {
    const { el, model, row } = mount({ limits: LIMITS, readings: snapshot() });
    const root = el.find((n) => n.className.split(" ").includes("skx-gauges"))[0];
    const toggle = el.find((n) => n.className === "skx-gauges__toggle")[0];
    assert.equal(root.className, "skx-gauges skx-gauges--compact");
    assert.equal(toggle.getAttribute("aria-expanded"), "false");
    toggle.click();
    model.set("readings", snapshot({ memory_mb: 30 }));
    assert.equal(root.className, "skx-gauges");
    assert.equal(toggle.getAttribute("aria-expanded"), "true");
    assert.equal(toggle.textContent, "less");
    toggle.click();
    assert.equal(root.className, "skx-gauges skx-gauges--compact");
    assert.equal(row("memory").getAttribute("data-used"), "true");
  });

  it("keeps the compact line short: the value against its limit, details in the panel", () => {
    const specs = gaugeSpecs(snapshot({ approval_wait_seconds: 3 }), LIMITS);
    assert.equal(specs.find((s) => s.key === "elapsed").short, "2.0 s of 20.0 s");
    assert.match(specs.find((s) => s.key === "elapsed").text, /waiting for your answer/);
    assert.equal(specs.find((s) => s.key === "cpu").short, "1.0 s of 10.0 s");
    const frozen = gaugeSpecs(snapshot({ peak_memory_mb: 150 }), LIMITS, { frozen: true });
    assert.equal(frozen.find((s) => s.key === "memory").short, "peak 150 MB of 200 MB");
  });

  it("marks tokens and cost as used only once something reported them", () => {
    const { model, row } = mount({ limits: LIMITS, readings: snapshot() });
    assert.equal(row("tokens").getAttribute("data-used"), "false");
    assert.equal(row("cost").getAttribute("data-used"), "false");
    model.set("readings", snapshot({ tokens_used: 12 }));
    assert.equal(row("tokens").getAttribute("data-used"), "true");
    assert.equal(row("cost").getAttribute("data-used"), "false");
  });

  it("the cleanup it returns removes every listener it added", () => {
    const { model, cleanup } = mount({ limits: LIMITS, readings: snapshot() });
    assert.ok(model.listenerCount() > 0);
    cleanup();
    assert.equal(model.listenerCount(), 0);
  });
});
