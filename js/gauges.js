// Live resource gauges of a sandboxed cell: an anywidget ESM view (no build step).
//
// The model carries three synced traits written by sandbox_kernel_ext/notebook/gauges.py:
//   limits     {memory_mb, cpu_seconds, timeout_seconds, tokens, cost_usd}  (null = no limit)
//   readings   the monitor's latest snapshot (one comm message per update carries all of it)
//   outcome    "" while the cell runs, then the final summary line ("finished", "killed: ...")
//   thresholds {warn, danger}: fractions of a limit where the colour changes
// Everything that decides what is shown is a pure function exported below, so node's test
// runner checks it without a DOM; render() only maps those specs onto elements.

export const DEFAULT_THRESHOLDS = Object.freeze({ warn: 0.75, danger: 0.9 });

const MISSING = "—";
// After the time a run spent waiting for a person, which its timeout does not count.
export const WAIT_WORDS = "waiting for your answer, not counted";

function isNumber(x) {
  return typeof x === "number" && Number.isFinite(x);
}

/** value / limit, unclamped; null when there is no limit (null, 0 or not a number). */
export function ratio(value, limit) {
  if (!isNumber(value) || !isNumber(limit) || limit <= 0) return null;
  return Math.max(value, 0) / limit;
}

/** "none" without a limit, else "ok" | "warn" | "danger" by how near the value is. */
export function gaugeState(value, limit, thresholds = DEFAULT_THRESHOLDS) {
  const r = ratio(value, limit);
  if (r === null) return "none";
  if (r >= thresholds.danger) return "danger";
  if (r >= thresholds.warn) return "warn";
  return "ok";
}

export function formatSeconds(s) {
  if (!isNumber(s)) return MISSING;
  if (s < 1) return `${s.toFixed(2)} s`;
  if (s < 60) return `${s.toFixed(1)} s`;
  const minutes = Math.floor(s / 60);
  const rest = Math.floor(s - minutes * 60);
  return `${minutes} min ${String(rest).padStart(2, "0")} s`;
}

export function formatMegabytes(mb) {
  if (!isNumber(mb)) return MISSING;
  if (mb >= 1024) return `${(mb / 1024).toFixed(2)} GB`;
  return `${mb.toFixed(mb < 10 ? 1 : 0)} MB`;
}

export function formatCount(n) {
  if (!isNumber(n)) return MISSING;
  return String(Math.round(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

export function formatCost(usd) {
  if (!isNumber(usd)) return MISSING;
  return `$${usd.toFixed(usd < 1 ? 4 : 2)}`;
}

export function formatPercent(r) {
  if (!isNumber(r)) return MISSING;
  return `${Math.round(r * 100)}%`;
}

/** The words shown next to a coloured gauge, so the state is never told by colour alone. */
export function stateWords(state, r) {
  if (state === "danger") return r >= 1 ? "at limit" : "near limit";
  if (state === "warn") return "high";
  return "";
}

// Which reading feeds each gauge, which limit bounds it, and how its numbers read.
const GAUGES = [
  { key: "cpu", label: "CPU", reading: "cpu_seconds", limit: "cpu_seconds", format: formatSeconds },
  { key: "memory", label: "Memory", reading: "memory_mb", limit: "memory_mb",
    format: formatMegabytes },
  { key: "elapsed", label: "Elapsed", reading: "elapsed_seconds", limit: "timeout_seconds",
    format: formatSeconds },
  { key: "tokens", label: "Tokens", reading: "tokens_used", limit: "tokens", format: formatCount },
  { key: "cost", label: "Cost", reading: "cost_usd", limit: "cost_usd", format: formatCost },
];

/** Tokens and cost show in the compact line only once something reported them. */
export function isUsed(key, value) {
  if (key !== "tokens" && key !== "cost") return true;
  return isNumber(value) && value > 0;
}

/**
 * What each gauge shows, as plain data: {key, label, value, max, state, percent, text, short,
 * words, ariaText, used}; `short` is what the compact line shows. `max` is null when the gauge has no limit (then the view shows no bar). After the
 * run (`frozen`) the memory gauge shows the peak, which is what a summary is about, and the CPU
 * gauge drops its momentary rate.
 */
export function gaugeSpecs(readings, limits, { frozen = false, thresholds } = {}) {
  const r = readings || {};
  const l = limits || {};
  const t = { ...DEFAULT_THRESHOLDS, ...(thresholds || {}) };
  return GAUGES.map((g) => {
    const peakOnly = g.key === "memory" && frozen;
    const reading = peakOnly ? "peak_memory_mb" : g.reading;
    const value = isNumber(r[reading]) ? r[reading] : null;
    const max = isNumber(l[g.limit]) && l[g.limit] > 0 ? l[g.limit] : null;
    const rr = ratio(value, max);
    const state = value === null ? (max === null ? "none" : "ok") : gaugeState(value, max, t);
    const words = stateWords(state, rr);
    let text = (peakOnly ? "peak " : "") + g.format(value);
    if (max !== null) text += ` of ${g.format(max)}`;
    const short = text; // the compact line: the value against its limit, nothing more
    if (max !== null) text += ` (${formatPercent(rr)})`;
    if (g.key === "cpu" && !frozen && isNumber(r.cpu_percent)) {
      text += ` · ${Math.round(r.cpu_percent)}% now`;
    }
    if (g.key === "memory" && !frozen && isNumber(r.peak_memory_mb)) {
      text += ` · peak ${formatMegabytes(r.peak_memory_mb)}`;
    }
    if (g.key === "elapsed" && isNumber(r.approval_wait_seconds) && r.approval_wait_seconds > 0) {
      text += ` · ${formatSeconds(r.approval_wait_seconds)} ${WAIT_WORDS}`;
    }
    const ariaText = words ? `${text}, ${words}` : text;
    return {
      key: g.key,
      label: g.label,
      value,
      max,
      state,
      percent: rr === null ? null : Math.min(rr, 1) * 100,
      peakPercent:
        g.key === "memory" && !frozen ? ratioPercent(r.peak_memory_mb, max) : null,
      text,
      short,
      words,
      ariaText,
      used: isUsed(g.key, value),
    };
  });
}

function ratioPercent(value, max) {
  const rr = ratio(value, max);
  return rr === null ? null : Math.min(rr, 1) * 100;
}

/** The line above the gauges: running, or the outcome and egress counts after the run. */
export function statusLine(readings, outcome) {
  if (!outcome) return "Sandbox running…";
  const r = readings || {};
  const parts = [`Sandbox ${outcome}`];
  if (isNumber(r.peak_processes)) {
    parts.push(`${formatCount(r.peak_processes)} process(es) at peak`);
  } else if (isNumber(r.processes)) {
    parts.push(`${formatCount(r.processes)} process(es)`);
  }
  if (isNumber(r.egress_allowed) || isNumber(r.egress_denied)) {
    parts.push(
      `egress ${formatCount(r.egress_allowed ?? 0)} allowed, ` +
        `${formatCount(r.egress_denied ?? 0)} denied`,
    );
  }
  return parts.join(" · ");
}

const CSS = `
.skx-gauges { font-family: var(--jp-ui-font-family, sans-serif);
  font-size: var(--jp-ui-font-size1, 13px); color: var(--jp-ui-font-color1, #222);
  padding: 4px 0; }
.skx-gauges__status { font-weight: 600; margin-bottom: 2px; }
.skx-gauges__grid { display: grid;
  grid-template-columns: max-content minmax(6em, 14em) max-content max-content;
  justify-content: start; gap: 2px 8px; align-items: center; }
.skx-gauge__bar { position: relative; height: 0.8em; border-radius: 3px; overflow: hidden;
  background: var(--jp-layout-color3, #ddd); }
.skx-gauge__fill { height: 100%; width: 0; transition: width 0.15s linear;
  background: var(--jp-success-color1, #2e7d32); }
.skx-gauge__peak { position: absolute; top: 0; bottom: 0; width: 2px;
  background: var(--jp-ui-font-color2, #555); }
.skx-gauge[data-state="warn"] .skx-gauge__fill { background: var(--jp-warn-color1, #ef6c00); }
.skx-gauge[data-state="danger"] .skx-gauge__fill { background: var(--jp-error-color1, #c62828); }
.skx-gauge__badge { font-weight: 600; }
.skx-gauge[data-state="warn"] .skx-gauge__badge { color: var(--jp-warn-color1, #ef6c00); }
.skx-gauge[data-state="danger"] .skx-gauge__badge { color: var(--jp-error-color1, #c62828); }
.skx-gauge { display: contents; }
.skx-gauges__toggle { font: inherit; font-size: 0.9em; padding: 0 6px; margin-left: 4px;
  cursor: pointer; border: 1px solid var(--jp-border-color1, #bbb); border-radius: 3px;
  background: var(--jp-layout-color1, #fff); color: var(--jp-ui-font-color1, #222); }
.skx-gauges--compact { display: flex; flex-wrap: wrap; align-items: center; gap: 2px 12px; }
.skx-gauges--compact .skx-gauges__status { margin-bottom: 0; }
.skx-gauges--compact .skx-gauges__grid { display: flex; flex-wrap: wrap; gap: 2px 12px; }
.skx-gauges--compact .skx-gauge { display: inline-flex; align-items: center; gap: 4px; }
.skx-gauges--compact .skx-gauge__slot { width: 5em; }
.skx-gauges--compact .skx-gauge[data-used="false"] { display: none; }
.skx-gauge__short { display: none; }
.skx-gauges--compact .skx-gauge__short { display: inline; }
.skx-gauges--compact .skx-gauge__text { display: none; }
`;

function child(doc, parent, tag, className) {
  const node = doc.createElement(tag);
  node.className = className;
  parent.appendChild(node);
  return node;
}

/** Puts one gauge's spec onto its row; the bar exists only while the gauge has a limit. */
function applySpec(doc, row, spec) {
  row.root.setAttribute("data-state", spec.state);
  row.root.setAttribute("data-used", String(spec.used));
  row.label.textContent = spec.label;
  row.short.textContent = spec.short;
  row.text.textContent = spec.text;
  row.badge.textContent = spec.words;
  if (spec.max === null) {
    if (row.bar) {
      row.slot.removeChild(row.bar);
      row.bar = row.fill = row.peak = null;
    }
    return;
  }
  if (!row.bar) {
    row.bar = child(doc, row.slot, "div", "skx-gauge__bar");
    row.bar.setAttribute("role", "meter");
    row.bar.setAttribute("aria-valuemin", "0");
    row.fill = child(doc, row.bar, "div", "skx-gauge__fill");
    row.peak = child(doc, row.bar, "div", "skx-gauge__peak");
  }
  const now = spec.value === null ? 0 : Math.min(spec.value, spec.max);
  row.bar.setAttribute("aria-label", spec.label);
  row.bar.setAttribute("aria-valuemax", String(spec.max));
  row.bar.setAttribute("aria-valuenow", String(now));
  row.bar.setAttribute("aria-valuetext", spec.ariaText);
  row.fill.style.width = `${spec.percent ?? 0}%`;
  if (spec.peakPercent === null) {
    row.peak.style.display = "none";
  } else {
    row.peak.style.display = "";
    row.peak.style.left = `calc(${spec.peakPercent}% - 1px)`;
  }
}

function render({ model, el }) {
  const doc = el.ownerDocument;
  const style = doc.createElement("style");
  style.textContent = CSS;
  el.appendChild(style);
  // One line by default (time, CPU, memory; tokens and cost once used); the toggle opens the
  // full panel, and the choice stays with this view while the readings change.
  const root = child(doc, el, "div", "skx-gauges");
  // The status line sits outside the grid, so its length never resizes the gauges' columns.
  const status = child(doc, root, "div", "skx-gauges__status");
  const grid = child(doc, root, "div", "skx-gauges__grid");
  const toggle = child(doc, root, "button", "skx-gauges__toggle");
  toggle.type = "button";
  let compact = true;
  const layout = () => {
    root.className = compact ? "skx-gauges skx-gauges--compact" : "skx-gauges";
    toggle.textContent = compact ? "details" : "less";
    toggle.setAttribute("aria-expanded", String(!compact));
  };
  layout();
  toggle.addEventListener("click", () => {
    compact = !compact;
    layout();
  });
  status.setAttribute("role", "status");
  status.setAttribute("aria-live", "polite");
  const rows = new Map();
  for (const g of GAUGES) {
    const row = { root: child(doc, grid, "div", "skx-gauge") };
    row.root.setAttribute("data-gauge", g.key);
    row.label = child(doc, row.root, "span", "skx-gauge__label");
    row.slot = child(doc, row.root, "div", "skx-gauge__slot");
    row.short = child(doc, row.root, "span", "skx-gauge__short");
    row.text = child(doc, row.root, "span", "skx-gauge__text");
    row.badge = child(doc, row.root, "span", "skx-gauge__badge");
    row.bar = row.fill = row.peak = null;
    rows.set(g.key, row);
  }

  const draw = () => {
    const readings = model.get("readings");
    const outcome = model.get("outcome");
    root.setAttribute("data-frozen", outcome ? "true" : "false");
    status.textContent = statusLine(readings, outcome);
    const specs = gaugeSpecs(readings, model.get("limits"), {
      frozen: Boolean(outcome),
      thresholds: model.get("thresholds"),
    });
    for (const spec of specs) applySpec(doc, rows.get(spec.key), spec);
  };
  draw();
  const events = ["change:readings", "change:limits", "change:outcome", "change:thresholds"];
  for (const name of events) model.on(name, draw);
  return () => {
    for (const name of events) model.off(name, draw);
  };
}

export default { render };
