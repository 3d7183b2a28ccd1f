// Line and bar charts of a run's metric series (Plotly, one trace per series).

import { baseLayout, PLOT_CONFIG, stageColor, STAGE_COLORS } from './util.js';

/** Values of `key` over wall time from metric points [{wall_s, values, attempt}], skipping
 * missing values; the line breaks (a null) where a job's next attempt takes over. */
export function series(points, key) {
  const x = [];
  const y = [];
  let attempt = null;
  for (const p of points) {
    const v = p.values?.[key];
    if (v === undefined || v === null || !Number.isFinite(v)) continue;
    if (attempt !== null && (p.attempt ?? 1) !== attempt) {
      x.push(p.wall_s);
      y.push(null);
    }
    attempt = p.attempt ?? 1;
    x.push(p.wall_s);
    y.push(v);
  }
  return { x, y };
}

/** At most about ``limit`` of the points, evenly spaced, the last and every evaluation (a `metric` value: there are
 * few, and thinning would lose the time-to-accuracy curve) kept: a long running job's charts stay bounded. */
export function thinPoints(points, limit) {
  const last = points.length - 1;
  const every = last / Math.max(1, limit - 1);
  const picked = new Set(Array.from({ length: Math.min(limit, points.length) }, (_, i) => Math.round(i * every)));
  return points.filter((p, i) => picked.has(i) || i === last || p.values?.metric != null);
}

/** Keys present in any point, e.g. every `utilization.<stage>`. */
export function keysWithPrefix(points, prefix) {
  const keys = new Set();
  for (const p of points) for (const k of Object.keys(p.values || {})) if (k.startsWith(prefix)) keys.add(k);
  return [...keys].sort((a, b) => Number(a.slice(prefix.length)) - Number(b.slice(prefix.length)) || a.localeCompare(b));
}

/** Where each attempt after the first begins on the job's clock: [{x, text}] for `lineChart`'s marks. */
export function attemptMarks(attempts = []) {
  return attempts.filter((a) => a.attempt > 1 && a.offset_s != null)
    .map((a) => ({ x: a.offset_s, text: `attempt ${a.attempt}${a.resume_step ? ` · from step ${a.resume_step}` : ' · from the start'}` }));
}

export function lineChart(div, traces, { title, xTitle = '', xSuffix = 's', yTitle = '', y2Title, yRange, empty = 'no points yet', marks = [] } = {}) {
  // x is wall time by default: ticks say "2s", leaving room below them for a legend.
  const has = traces.some((t) => t.x.length);
  // A dashed line where each later attempt begins (the gap before it is the time the fault cost).
  const shown = has ? marks : [];
  const shapes = shown.map((m) => ({ type: 'line', xref: 'x', yref: 'paper', x0: m.x, x1: m.x, y0: 0, y1: 1, line: { color: '#9a6700', width: 1, dash: 'dash' } }));
  const markNotes = shown.map((m) => ({ text: m.text, x: m.x, xref: 'x', yref: 'paper', y: 1, yanchor: 'bottom', xanchor: 'left', showarrow: false, font: { size: 10, color: '#9a6700' } }));
  const layout = baseLayout({
    title: { text: title, x: 0, font: { size: 14 } },
    height: 260,
    // Without points, axes would show a made-up range: show only the message.
    xaxis: { title: { text: xTitle }, ticksuffix: xSuffix, zeroline: false, visible: has },
    yaxis: { title: { text: yTitle }, range: yRange, zeroline: false, visible: has },
    // a second quantity (traces with yaxis 'y2') on its own scale, at the right
    ...(y2Title ? { yaxis2: { title: { text: y2Title }, overlaying: 'y', side: 'right', zeroline: false, showgrid: false, visible: has } } : {}),
    // the right axis's tick labels and title need the room the left one has
    ...(y2Title ? { margin: { l: 60, r: 60, t: 32, b: 40 } } : {}),
    showlegend: traces.length > 1,
    legend: { orientation: 'h', x: 0, y: -0.12, yanchor: 'top' },
    annotations: has ? markNotes : [{ text: empty, showarrow: false, xref: 'paper', yref: 'paper', x: 0.5, y: 0.5, font: { color: '#52606d' } }],
    shapes,
  });
  return window.Plotly.react(div, traces.map((t) => ({ type: 'scatter', mode: t.x.length > 60 ? 'lines' : 'lines+markers', ...t })), layout, PLOT_CONFIG);
}

/** Per-stage busy fraction in time bins, from measured timeline events (compute kinds only). */
export function utilisationFromTimeline(events, bins = 40) {
  const compute = new Set(['F', 'B', 'BI', 'W', 'step']);
  if (!events.length) return [];
  let lo = Infinity;
  let hi = -Infinity;
  const replicas = new Map(); // stage -> set of workers
  for (const e of events) {
    if (e.start < lo) lo = e.start;
    if (e.end > hi) hi = e.end;
    if (!replicas.has(e.stage)) replicas.set(e.stage, new Set());
    replicas.get(e.stage).add(e.worker);
  }
  const width = (hi - lo) / bins || 1;
  const busy = new Map([...replicas.keys()].map((s) => [s, new Float64Array(bins)]));
  for (const e of events) {
    if (!compute.has(e.kind)) continue;
    const row = busy.get(e.stage);
    const first = Math.min(bins - 1, Math.floor((e.start - lo) / width));
    const last = Math.min(bins - 1, Math.floor((e.end - lo) / width));
    for (let b = first; b <= last; b++) {
      const overlap = Math.min(e.end, lo + (b + 1) * width) - Math.max(e.start, lo + b * width);
      if (overlap > 0) row[b] += overlap;
    }
  }
  const x = Array.from({ length: bins }, (_, b) => lo + (b + 0.5) * width);
  return [...busy.entries()].sort((a, b) => a[0] - b[0]).map(([stage, row]) => ({
    name: `stage ${stage}`,
    x,
    y: Array.from(row, (t) => Math.min(1, t / (width * replicas.get(stage).size))),
    line: { color: stageColor(stage) },
  }));
}

/** Utilisation traces from metrics (`utilization.<stage>`) when the run reports them. */
export function utilisationFromMetrics(points) {
  return keysWithPrefix(points, 'utilization.').map((key, i) => {
    const stage = Number(key.split('.')[1]);
    return { name: `stage ${Number.isFinite(stage) ? stage : key}`, ...series(points, key), line: { color: STAGE_COLORS[(Number.isFinite(stage) ? stage : i) % STAGE_COLORS.length] } };
  });
}

export function barChart(div, { x, y, text, colors, title, yTitle = '', height = 260 }) {
  return window.Plotly.react(div, [{ type: 'bar', x, y, text, textposition: 'auto', marker: { color: colors } }], baseLayout({
    title: { text: title, x: 0, font: { size: 14 } },
    height,
    yaxis: { title: { text: yTitle } },
    showlegend: false,
  }), PLOT_CONFIG);
}
