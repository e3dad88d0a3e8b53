// The live run page (server/src/live_page): polls api/run every second and draws what the server
// has published. The server's data is only ever set as text (textContent, SVG text nodes),
// never parsed as markup.
"use strict";

const POLL_MS = 1000;
const TABLE_ROWS = 50;
const SVG_NS = "http://www.w3.org/2000/svg";
const COLOURS = ["#2563eb", "#16a34a", "#b45309", "#b91c1c", "#7c3aed"];
// The sections beside [privacy] that a mode's parameters live in.
const MODE_SECTIONS = {
  secagg: ["secagg"],
  "ldp-gaussian": ["local"],
  "ldp-laplace": ["local"],
  signds: ["signds"],
};
// Ledger fields shown in their own columns or as flags, not among the event's parameters.
const LEDGER_TERMS = ["round", "accountant", "clip_mode", "clip_bound_leaks", "sampling_seeded"];

const state = { run: null, rounds: [], after: 0 };

const byId = (id) => document.getElementById(id);
const show = (id, value) => { byId(id).textContent = value; };
const fixed = (x, digits) => (x === null || x === undefined ? "–" : x.toFixed(digits));
const small = (x) => (x === null || x === undefined ? "–" : x.toExponential(2));

async function poll() {
  try {
    const response = await fetch(`api/run?after=${state.after}`, { cache: "no-store" });
    if (!response.ok) {
      throw new Error(`HTTP ${response.status}`);
    }
    absorb(await response.json());
  } catch (e) {
    const status = byId("status");
    status.className = "status unreachable";
    status.textContent = `Server unreachable (${e.message}): the run may have ended. Retrying…`;
  }
  setTimeout(poll, POLL_MS);
}

function absorb(snapshot) {
  if (!state.run) {
    describe(snapshot.run);
  }
  state.run = snapshot.run;
  for (const m of snapshot.rounds) {
    if (m.round > state.after) {
      state.rounds.push(m);
      state.after = m.round;
    }
  }
  showStatus(snapshot);
  showTiles(snapshot);
  drawCharts();
  showRounds();
  showAggregators();
  showLedger(snapshot.ledger);
}

/// The budget the ledger enforces, in the terms it is stated in.
function budgetOf(run) {
  if (!run.budget) {
    return null;
  }
  if (run.budget.epsilon) {
    const b = run.budget.epsilon;
    return { key: "epsilon", symbol: "ε", limit: b.epsilon, at: `at δ = ${b.delta}`, format: (v) => v.toFixed(3) };
  }
  const b = run.budget.delta;
  return { key: "delta", symbol: "δ", limit: b.delta, at: `at ε = ${b.epsilon}`, format: (v) => v.toExponential(1) };
}

function describe(run) {
  show("mode", run.mode);
  const list = byId("privacy");
  const add = (term, value) => {
    const dt = document.createElement("dt");
    dt.textContent = term;
    const dd = document.createElement("dd");
    dd.textContent = value;
    list.append(dt, dd);
  };
  add("mode", run.mode);
  const budget = budgetOf(run);
  if (budget) {
    add("budget", `${budget.symbol} ≤ ${budget.limit} ${budget.at}`);
    add("accountant", run.accountant);
  }
  if (run.mode === "none") {
    add("protection", "none: the server sees every update");
  } else {
    for (const [key, value] of Object.entries(run.privacy)) {
      add(`privacy.${key}`, JSON.stringify(value));
    }
    for (const section of MODE_SECTIONS[run.mode] || []) {
      for (const [key, value] of Object.entries(run.config[section] || {})) {
        add(`${section}.${key}`, JSON.stringify(value));
      }
    }
  }
  byId("ledger-empty").hidden = Boolean(budget);
  show("config", JSON.stringify(run.config, null, 2));
}

function showStatus(snapshot) {
  const run = snapshot.run;
  const last = state.rounds.at(-1);
  const status = byId("status");
  status.className = "status";
  const finished = {
    rounds: "Finished: all rounds ran.",
    budget: "Stopped: one more round would have exceeded the privacy budget.",
    interrupted: "Interrupted by the operator: the run can be resumed.",
    error: "Stopped: no connected client, or an error ended training.",
  }[snapshot.finished];
  if (finished) {
    status.className = "status finished";
    status.textContent = finished;
  } else if (!last && snapshot.connected < run.clients) {
    status.textContent = `Waiting for ${run.clients} clients (${snapshot.connected} connected).`;
  } else {
    const next = last ? last.round + 1 : 1;
    status.textContent = `Round ${next} of ${run.rounds} is running · updated ${new Date().toLocaleTimeString()}`;
  }
}

function showTiles(snapshot) {
  const run = snapshot.run;
  const last = state.rounds.at(-1);
  show("round", last ? String(last.round) : "–");
  show("round-of", `of ${run.rounds}`);
  const evaluated = [...state.rounds].reverse().find((m) => m.test_accuracy !== null);
  show("accuracy", fixed(evaluated && evaluated.test_accuracy, 4));
  show("loss", evaluated ? `test loss ${fixed(evaluated.test_loss, 4)} · round ${evaluated.round}` : "");
  const budget = budgetOf(run);
  if (budget) {
    show("spent", last && last[budget.key] !== null ? budget.format(last[budget.key]) : "–");
    show("budget", `budget ${budget.symbol} = ${budget.limit} ${budget.at}`);
  } else if (last && last.local_epsilon !== undefined) {
    show("spent", fixed(last.local_epsilon, 3));
    show("budget", "largest local ε of any client");
  } else {
    show("spent", "–");
    show("budget", "no central accounting in this mode");
  }
  show("connected", String(snapshot.connected));
  const buffer = last && last.buffer;
  show("clients", buffer ? `K = ${run.clients}, buffer of ${buffer.size}` : `K = ${run.clients}, m = ${run.clients_per_round}`);
}

function drawCharts() {
  const run = state.run;
  const rounds = state.rounds;
  const last = rounds.length ? rounds.at(-1).round : 1;
  const xmax = Math.max(2, Math.min(run.rounds, Math.max(last + 1, 10)));
  const series = (key, label, pick = (m) => m[key]) => ({
    label,
    points: rounds.filter((m) => pick(m) !== null && pick(m) !== undefined).map((m) => [m.round, pick(m)]),
  });
  const accuracy = series("test_accuracy", "test accuracy");
  drawChart(byId("chart-accuracy"), { xmax, ymin: 0, ymax: 1, series: [accuracy], format: (v) => v.toFixed(1) });
  const loss = series("test_loss", "test loss");
  const lossMax = Math.max(0.1, ...loss.points.map((p) => p[1]));
  drawChart(byId("chart-loss"), { xmax, ymin: 0, ymax: lossMax * 1.1, series: [loss], format: (v) => v.toFixed(2) });
  drawPrivacy(xmax);
  const counts = ["connected", "sampled", "completed", "dropped", "refused"].map((k) => series(k, k));
  const most = Math.max(1, ...counts.flatMap((s) => s.points.map((p) => p[1])));
  // Headroom above the largest count for the legend.
  drawChart(byId("chart-clients"), { xmax, ymin: 0, ymax: most * 1.4, series: counts, format: (v) => String(Math.round(v)) });
  drawBuffer(xmax, series);
}

// Asynchronous runs: each line is a server step with its buffer's figures.
function drawBuffer(xmax, series) {
  const buffered = state.rounds.filter((m) => m.buffer);
  byId("buffer-figure").hidden = buffered.length === 0;
  if (buffered.length === 0) return;
  const quantile = (b, q) => {
    const total = b.staleness.reduce((a, n) => a + n, 0);
    let seen = 0;
    return b.staleness.findIndex((n) => (seen += n) >= q * total && total > 0);
  };
  const pick = (f) => (m) => (m.buffer ? f(m.buffer) : null);
  const lines = [
    series("training", "clients training", pick((b) => b.training)),
    series("median", "median staleness", pick((b) => quantile(b, 0.5))),
    series("max", "max staleness", pick((b) => quantile(b, 1))),
    series("stale", "refused as too stale", pick((b) => b.too_stale)),
  ];
  const most = Math.max(1, ...lines.flatMap((s) => s.points.map((p) => p[1])));
  drawChart(byId("chart-buffer"), { xmax, ymin: 0, ymax: most * 1.4, series: lines, format: (v) => String(Math.round(v)) });
}

function drawPrivacy(xmax) {
  const budget = budgetOf(state.run);
  const svg = byId("chart-privacy");
  if (!budget) {
    const local = {
      label: "largest local ε",
      points: state.rounds.filter((m) => m.local_epsilon !== undefined).map((m) => [m.round, m.local_epsilon]),
    };
    const top = Math.max(1, ...local.points.map((p) => p[1]));
    show("privacy-caption", local.points.length ? "Local privacy spent (largest of any client)" : "Privacy spent");
    drawChart(svg, { xmax, ymin: 0, ymax: top * 1.1, series: [local], format: (v) => v.toFixed(1),
      empty: "no privacy accounting in this mode" });
    return;
  }
  const spent = {
    label: `${budget.symbol} spent`,
    points: state.rounds.filter((m) => m[budget.key] > 0).map((m) => [m.round, m[budget.key]]),
  };
  const line = { y: budget.limit, label: `budget ${budget.symbol} = ${budget.limit}: training stops before this line` };
  if (budget.key === "epsilon") {
    const top = Math.max(budget.limit, ...spent.points.map((p) => p[1])) * 1.12;
    drawChart(svg, { xmax, ymin: 0, ymax: top, series: [spent], format: budget.format, lines: [line] });
    return;
  }
  // delta grows by orders of magnitude until the last rounds: drawn as log10(delta), whole decades.
  show("privacy-caption", "Privacy spent against the budget (δ at a fixed ε, log scale)");
  const log = (v) => Math.log10(v);
  const logged = { label: spent.label, points: spent.points.map(([r, v]) => [r, log(v)]) };
  const lowest = Math.min(log(budget.limit) - 1, ...logged.points.map((p) => p[1]));
  const step = Math.max(1, niceStep((log(budget.limit) - lowest) / 5));
  drawChart(svg, {
    xmax, ymin: Math.floor(lowest / step) * step, ymax: log(budget.limit) + 0.5, step,
    series: [logged], format: (v) => `1e${Math.round(v)}`, lines: [{ ...line, y: log(budget.limit) }],
  });
}

/// Round numbers: multiples of a whole-number step (about `count` of them) up to `max`, and 1.
function roundTicks(max, count) {
  const step = Math.max(1, niceStep((max - 1) / count));
  const ticks = step === 1 || step >= 5 ? [1] : [];
  for (let r = step; r <= max; r += step) {
    if (r > 1) {
      ticks.push(r);
    }
  }
  return ticks;
}

/// 1, 2 or 5 times a power of ten, near `raw`.
function niceStep(raw) {
  const power = 10 ** Math.floor(Math.log10(raw || 1));
  const scaled = raw / power;
  return (scaled < 1.5 ? 1 : scaled < 3.5 ? 2 : scaled < 7.5 ? 5 : 10) * power;
}

function element(name, attributes, content) {
  const e = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attributes)) {
    e.setAttribute(key, value);
  }
  if (content !== undefined) {
    e.textContent = content;
  }
  return e;
}

/// A line chart of rounds 1..xmax against [ymin, ymax] (y ticks `step` apart, or a nice step),
/// with labelled horizontal lines.
function drawChart(svg, { xmax, ymin, ymax, series, format, step, lines = [], empty = "no round yet" }) {
  const [width, height, left, right, top, bottom] = [480, 240, 52, 14, 12, 30];
  const x = (r) => left + ((r - 1) / (xmax - 1)) * (width - left - right);
  const y = (v) => top + (1 - (v - ymin) / (ymax - ymin)) * (height - top - bottom);
  svg.replaceChildren();
  const yStep = step || niceStep((ymax - ymin) / 5);
  for (let v = ymin; v <= ymax + 1e-12; v += yStep) {
    svg.append(element("line", { class: "grid", x1: left, x2: width - right, y1: y(v), y2: y(v) }));
    svg.append(element("text", { class: "tick", x: left - 6, y: y(v) + 4, "text-anchor": "end" }, format(v)));
  }
  for (const r of roundTicks(xmax, 6)) {
    svg.append(element("text", { class: "tick", x: x(r), y: height - bottom + 16, "text-anchor": "middle" }, String(r)));
  }
  svg.append(element("line", { class: "axis", x1: left, x2: left, y1: top, y2: height - bottom }));
  svg.append(element("line", { class: "axis", x1: left, x2: width - right, y1: height - bottom, y2: height - bottom }));
  svg.append(element("text", { class: "tick", x: width - right, y: height - 2, "text-anchor": "end" }, "round"));
  for (const line of lines) {
    svg.append(element("line", { class: "budget", x1: left, x2: width - right, y1: y(line.y), y2: y(line.y) }));
    svg.append(element("text", { class: "budget-label", x: left + 6, y: y(line.y) - 5 }, line.label));
  }
  const drawn = series.filter((s) => s.points.length > 0);
  if (drawn.length === 0) {
    svg.append(element("text", { class: "empty", x: width / 2, y: height / 2, "text-anchor": "middle" }, empty));
  }
  series.forEach((s, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const points = s.points.map(([r, v]) => `${x(r).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg.append(element("polyline", { class: "curve", stroke: colour, points }));
    if (s.points.length === 1) {
      const [r, v] = s.points[0];
      svg.append(element("circle", { cx: x(r), cy: y(v), r: 3, fill: colour }));
    }
    if (series.length > 1) {
      svg.append(element("rect", { x: width - right - 96, y: top + 4 + i * 14, width: 10, height: 3, fill: colour }));
      svg.append(element("text", { class: "legend", x: width - right - 82, y: top + 9 + i * 14 }, s.label));
    }
  });
}

function showRounds() {
  const body = byId("rounds").tBodies[0];
  const rows = state.rounds.slice(-TABLE_ROWS).reverse().map((m) => {
    const tr = document.createElement("tr");
    tr.dataset.round = String(m.round);
    if (!m.applied) {
      tr.className = "skipped";
      tr.title = `model unchanged: ${m.skipped}`;
    }
    const epsilon = m.epsilon !== null ? fixed(m.epsilon, 4)
      : m.local_epsilon !== undefined ? `${fixed(m.local_epsilon, 4)} (local)` : "–";
    const cells = [
      String(m.round), String(m.connected), String(m.sampled), String(m.completed),
      String(m.dropped), String(m.refused), fixed(m.test_accuracy, 4), fixed(m.test_loss, 4),
      epsilon, small(m.delta), fixed(m.seconds, 2),
    ];
    const classes = ["round", "connected", "sampled", "completed", "dropped", "refused",
      "accuracy", "loss", "epsilon", "delta", "seconds"];
    cells.forEach((value, i) => {
      const td = document.createElement("td");
      td.className = classes[i];
      td.textContent = value;
      tr.append(td);
    });
    return tr;
  });
  body.replaceChildren(...rows);
}

// A coordinator of aggregators: each aggregator's figures over the rounds it was sent.
function showAggregators() {
  const byName = new Map();
  for (const m of state.rounds) {
    for (const g of m.groups || []) {
      const a = byName.get(g.aggregator) || { clients: 0, seconds: [], summed: 0, dropped: 0, failures: {} };
      a.clients = g.connected;
      a.dropped += g.dropped;
      if (g.seconds !== null) a.seconds.push(g.seconds);
      if (g.outcome === "summed") a.summed += 1;
      else a.failures[g.outcome] = (a.failures[g.outcome] || 0) + 1;
      byName.set(g.aggregator, a);
    }
  }
  byId("aggregators-section").hidden = byName.size === 0;
  const median = (xs) => {
    const s = [...xs].sort((x, y) => x - y);
    return s.length ? (s[(s.length - 1) >> 1] + s[s.length >> 1]) / 2 : null;
  };
  const rows = [...byName.entries()].sort(([x], [y]) => x.localeCompare(y)).map(([name, a]) => {
    const tr = document.createElement("tr");
    tr.dataset.aggregator = name;
    const failures = Object.entries(a.failures).map(([k, n]) => `${k} ${n}`).join(", ") || "none";
    const cells = [name, String(a.clients), fixed(a.seconds[a.seconds.length - 1], 2),
      fixed(median(a.seconds), 2), String(a.summed), String(a.dropped), failures];
    for (const value of cells) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    return tr;
  });
  byId("aggregators").tBodies[0].replaceChildren(...rows);
}

function showLedger(entries) {
  const body = byId("ledger").tBodies[0];
  const rows = [...entries].reverse().map((entry) => {
    const tr = document.createElement("tr");
    const parameters = Object.entries(entry)
      .filter(([key]) => !LEDGER_TERMS.includes(key))
      .map(([key, value]) => `${key} = ${JSON.stringify(value)}`);
    if (entry.clip_bound_leaks) {
      parameters.push("the clip bound leaks: not covered");
    }
    if (entry.sampling_seeded) {
      parameters.push("seeded sampling: not a guarantee");
    }
    for (const value of [String(entry.round), entry.accountant, parameters.join(", ")]) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    return tr;
  });
  body.replaceChildren(...rows);
}

poll();
