// The pipeline Gantt: a row per worker (its stage and replica), bars per action.
//
// ONE Plotly bar trace per action kind, with parallel arrays (y = row, base = start,
// x = duration): 100,000 actions are ten traces, not 100,000. Compute actions fill the upper
// part of a row, communication a thin lane below.
//
// Plotly draws each bar as an SVG path (~0.15 ms each here), so 100,000 bars would take ~15 s.
// When more than `lodThreshold` actions fall inside the visible range, bars are aggregated per
// pixel column (see gantt_lod.js): each column shows the kind that kept the lane busiest, runs of
// equal columns become one bar, and the hover says how many actions a bar stands for. Zooming in
// redraws from the full event list, down to single actions.
//
// A worker holding several model chunks (interleaved, looped BFS, ZB-V, DualPipeV) draws its
// first chunk's bars plain and its later chunks' hatched (CHUNK_PATTERNS), so a V-placed
// schedule shows each worker's way down and way back up apart; the key says so.

import { baseLayout, PLOT_CONFIG } from './util.js';
import { aggregateByPixel } from './gantt_lod.js';

export const KINDS = [
  { kind: 'F', label: 'forward', color: '#4C78A8', lane: 'compute' },
  { kind: 'B', label: 'backward', color: '#E45756', lane: 'compute' },
  { kind: 'BI', label: 'backward (input)', color: '#F58518', lane: 'compute' },
  { kind: 'W', label: 'backward (weights)', color: '#B279A2', lane: 'compute' },
  { kind: 'step', label: 'optimizer step', color: '#54A24B', lane: 'compute' },
  { kind: 'send_act', label: 'send activation', color: '#72B7B2', lane: 'comm' },
  { kind: 'recv_act', label: 'recv activation', color: '#9ECAE9', lane: 'comm' },
  { kind: 'send_grad', label: 'send gradient', color: '#9D755D', lane: 'comm' },
  { kind: 'recv_grad', label: 'recv gradient', color: '#D8B5A5', lane: 'comm' },
  { kind: 'allreduce', label: 'all-reduce', color: '#EECA3B', lane: 'comm' },
];
export const OTHER_KIND = { kind: 'other', label: 'other', color: '#999999', lane: 'comm' };
export const KIND_INDEX = new Map(KINDS.map((k, i) => [k.kind, i]));
const LANES = { compute: { offset: -0.4, width: 0.58 }, comm: { offset: 0.2, width: 0.22 } };
/** Bar patterns by a worker's chunk: its first plain, later ones hatched (a fourth and on: dotted). */
export const CHUNK_PATTERNS = ['', '/', 'x', '.'];

/** Rows of the chart: one per worker, labelled with the stage(s) it holds, its replica and the
 * host(s) it ran on (measured events say; a retried attempt may place a worker elsewhere). */
export function workerRows(events) {
  const byWorker = new Map();
  for (const e of events) {
    let row = byWorker.get(e.worker);
    if (!row) { row = { worker: e.worker, stages: new Set(), replica: e.replica ?? 0, hosts: new Set() }; byWorker.set(e.worker, row); }
    row.stages.add(e.stage);
    if (e.host) row.hosts.add(e.host);
  }
  const rows = [...byWorker.values()].sort((a, b) => a.worker - b.worker);
  rows.forEach((row, index) => {
    row.index = index;
    row.chunks = [...row.stages].sort((a, b) => a - b); // chunk c is its c-th stage, in a loop or a V alike
    const stages = row.chunks.join(',');
    row.label = `w${row.worker} · s${stages} r${row.replica}${row.hosts.size ? ` · ${[...row.hosts].join('/')}` : ''}`;
  });
  return rows;
}

/** [min start, max end] over all events, or null. */
export function extent(events) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const e of events) {
    if (e.start < lo) lo = e.start;
    if (e.end > hi) hi = e.end;
  }
  return Number.isFinite(lo) ? [lo, hi > lo ? hi : lo + 1e-6] : null;
}

/** [start, end] covering the newest `steps` steps of `events` (for following a live run). */
export function newestStepsRange(events, steps) {
  if (!events.length) return null;
  let maxStep = -Infinity;
  for (const e of events) if ((e.step ?? 0) > maxStep) maxStep = e.step ?? 0;
  const first = maxStep - steps + 1;
  let lo = Infinity;
  let hi = -Infinity;
  for (const e of events) {
    if (e.end > hi) hi = e.end;
    if ((e.step ?? 0) >= first && e.start < lo) lo = e.start;
  }
  return Number.isFinite(lo) ? [lo, hi > lo ? hi : lo + 1e-6] : null;
}

/** Median over steps of (last end - first start) of the step's actions: seconds per iteration. */
export function medianStepTime(events) {
  const spans = new Map();
  for (const e of events) {
    const s = spans.get(e.step ?? 0);
    if (!s) spans.set(e.step ?? 0, [e.start, e.end]);
    else { if (e.start < s[0]) s[0] = e.start; if (e.end > s[1]) s[1] = e.end; }
  }
  const times = [...spans.values()].map(([a, b]) => b - a).filter((t) => t > 0).sort((a, b) => a - b);
  return times.length ? times[Math.floor(times.length / 2)] : null;
}

function traceFor(kindIndex, bars, aggregated) {
  const meta = KINDS[kindIndex] || OTHER_KIND;
  const lane = LANES[meta.lane];
  const hover = aggregated
    ? `<b>${meta.label}</b> mostly · %{customdata[0]} actions<br>%{customdata[1]:.4f} s → %{customdata[2]:.4f} s<extra>zoom in for single actions</extra>`
    : `<b>${meta.label}</b> · microbatch %{customdata[0]} · step %{customdata[3]}<br>%{customdata[1]:.4f} s → %{customdata[2]:.4f} s${bars.shape ? ' · stage %{customdata[4]}, chunk %{customdata[5]}' : ''}<extra>%{y}</extra>`;
  return {
    type: 'bar',
    orientation: 'h',
    name: meta.label,
    legendgroup: meta.kind,
    y: bars.y.subarray(0, bars.n),
    base: bars.base.subarray(0, bars.n),
    x: bars.x.subarray(0, bars.n),
    customdata: bars.custom,
    offset: lane.offset,
    width: lane.width,
    marker: { color: meta.color, line: { width: 0 },
      ...(bars.shape ? { pattern: { shape: bars.shape, fillmode: 'overlay', fgcolor: '#ffffff', size: 6, solidity: 0.35 } } : {}) },
    hovertemplate: hover,
  };
}

function columns(counts) {
  return counts.map((n) => ({ y: new Float64Array(n), base: new Float64Array(n), x: new Float64Array(n), custom: new Array(n), n: 0 }));
}

/** Exact traces: one bar per action, one trace per kind. */
export function exactTraces(events, rows) {
  const rowOf = new Map(rows.map((r) => [r.worker, r.index]));
  const chunksOf = new Map(rows.map((r) => [r.worker, r.chunks || []]));
  const chunked = rows.some((r) => (r.chunks || []).length > 1);
  const other = KINDS.length;
  const counts = new Array(KINDS.length + 1).fill(0);
  for (const e of events) counts[KIND_INDEX.get(e.kind) ?? other] += 1;
  const cols = columns(counts);
  if (chunked) for (const c of cols) c.shape = new Array(c.custom.length);
  for (const e of events) {
    const c = cols[KIND_INDEX.get(e.kind) ?? other];
    const i = c.n++;
    c.y[i] = rowOf.get(e.worker);
    c.base[i] = e.start;
    c.x[i] = e.end - e.start;
    c.custom[i] = [e.microbatch, e.start, e.end, e.step ?? 0];
    if (chunked) {
      const chunk = Math.max(0, chunksOf.get(e.worker).indexOf(e.stage));
      c.custom[i].push(e.stage, chunk);
      c.shape[i] = CHUNK_PATTERNS[Math.min(chunk, CHUNK_PATTERNS.length - 1)];
    }
  }
  return cols.map((c, k) => (c.n ? traceFor(k, c, false) : null)).filter(Boolean);
}

/** Aggregated traces: bars from gantt_lod.js, still one trace per kind. */
function aggregatedTraces(bars) {
  const counts = new Array(KINDS.length + 1).fill(0);
  for (const b of bars) counts[b.kind] += 1;
  const cols = columns(counts);
  for (const b of bars) {
    const c = cols[b.kind];
    const i = c.n++;
    c.y[i] = b.row;
    c.base[i] = b.start;
    c.x[i] = b.end - b.start;
    c.custom[i] = [b.count, b.start, b.end];
  }
  return cols.map((c, k) => (c.n ? traceFor(k, c, true) : null)).filter(Boolean);
}

export function ganttLayout(rows, { title = '', range = null, uirevision = 'gantt', note = '' } = {}) {
  if (!rows.length) note = 'no timeline events yet';
  return baseLayout({
    title: title ? { text: title, x: 0, font: { size: 14 } } : undefined,
    barmode: 'overlay',
    height: Math.max(180, 30 * rows.length + 100),
    hovermode: 'closest',
    uirevision,
    // The colour key is HTML above the chart (see kindKey): a Plotly legend that wraps onto
    // several lines would eat into the fixed height. The level-of-detail note sits top left.
    showlegend: false,
    margin: { l: 110, r: 16, t: (title ? 28 : 0) + (note && rows.length ? 30 : 12), b: 30 },
    annotations: note ? [rows.length
      ? { text: note, xref: 'paper', yref: 'paper', x: 0, y: 1, xanchor: 'left', yanchor: 'bottom', yshift: 6, showarrow: false, font: { size: 11, color: '#52606d' } }
      : { text: note, xref: 'paper', yref: 'paper', x: 0.5, y: 0.5, showarrow: false, font: { size: 13, color: '#52606d' } }] : [],
    xaxis: { ticksuffix: 's', range: range || undefined, autorange: !range, zeroline: false, visible: rows.length > 0 },
    yaxis: { tickvals: rows.map((r) => r.index), ticktext: rows.map((r) => r.label), autorange: 'reversed', fixedrange: true },
  });
}

/** The colour key of the kinds present in `events`, as HTML (it wraps on a narrow window). */
export function kindKey(events) {
  const present = new Set(events.map((e) => e.kind));
  const key = document.createElement('div');
  key.className = 'gantt-key';
  for (const k of [...KINDS, OTHER_KIND]) {
    if (!present.has(k.kind) && !(k === OTHER_KIND && [...present].some((p) => !KIND_INDEX.has(p)))) continue;
    const item = document.createElement('span');
    const swatch = document.createElement('i');
    swatch.style.background = k.color;
    if (k.lane === 'comm') swatch.className = 'comm';
    item.append(swatch, k.label);
    key.append(item);
  }
  if (workerRows(events).some((r) => r.chunks.length > 1)) {
    const item = document.createElement('span');
    const swatch = document.createElement('i');
    swatch.className = 'later-chunk';
    item.append(swatch, "a worker's later chunks (hatched)");
    key.append(item);
  }
  return key;
}

/** Traces for the events inside `range` (exact, or aggregated when there are too many). */
export function ganttTraces(events, { range = null, rows = workerRows(events), widthPx = 1100, lodThreshold = 4000 } = {}) {
  const view = range || extent(events);
  if (!view) return { traces: [], rows, aggregated: false, shown: 0 };
  const [lo, hi] = view;
  const inView = events.filter((e) => e.end >= lo && e.start <= hi);
  if (inView.length <= lodThreshold) return { traces: exactTraces(inView, rows), rows, aggregated: false, shown: inView.length };
  const laneOf = [...KINDS, OTHER_KIND].map((k) => (k.lane === 'comm' ? 1 : 0));
  const bars = aggregateByPixel(inView, rows, view, Math.max(100, Math.round(widthPx / 3)), KIND_INDEX, laneOf);
  return { traces: aggregatedTraces(bars), rows, aggregated: true, shown: inView.length };
}

/**
 * A Gantt chart in `div`. Static by default (zoom and pan redraw at the new level of detail);
 * with `follow` it tracks the newest `windowSteps` steps of a live run until the user zooms or
 * pans, which pauses following (resume with `follow(true)`).
 */
export class GanttChart {
  constructor(div, { title = '', windowSteps = 0, following = false, maxEvents = 500000, lodThreshold = 4000, onFollowChange = () => {}, onDraw = () => {} } = {}) {
    Object.assign(this, { div, title, windowSteps, following, maxEvents, lodThreshold, onFollowChange, onDraw });
    this.events = [];
    this.userRange = null;
    this.revision = 0;
    this.drawing = null;
    this.dirty = false;
    this.listening = false;
  }

  setEvents(events) {
    this.events = events.length > this.maxEvents ? events.slice(-this.maxEvents) : events.slice();
    return this.redraw();
  }

  add(events) {
    if (!events.length) return this.drawing;
    for (const e of events) this.events.push(e);
    if (this.events.length > this.maxEvents) this.events.splice(0, this.events.length - this.maxEvents);
    return this.redraw();
  }

  follow(on) {
    this.following = on;
    if (on) this.userRange = null;
    this.onFollowChange(on);
    return this.redraw();
  }

  setWindow(steps) {
    this.windowSteps = steps;
    return this.follow(true);
  }

  viewRange() {
    if (this.following && this.windowSteps > 0) return newestStepsRange(this.events, this.windowSteps);
    return this.userRange || extent(this.events);
  }

  /** Redraws are serialised: updates that arrive while drawing lead to one more draw, not many. */
  redraw() {
    if (this.drawing) { this.dirty = true; return this.drawing; }
    // A new uirevision each draw makes our computed range win over Plotly's remembered zoom.
    this.revision += 1;
    const range = this.viewRange();
    const widthPx = this.div.clientWidth || 1100;
    const { traces, rows, aggregated, shown } = ganttTraces(this.events, { range, widthPx, lodThreshold: this.lodThreshold });
    const note = aggregated ? `${shown.toLocaleString('en-US')} actions in view, aggregated per 3-pixel column: zoom in for single actions` : '';
    const layout = ganttLayout(rows, { title: this.title, range, uirevision: this.revision, note });
    const kinds = [...new Set(this.events.map((e) => e.kind))].sort().join();
    if (kinds !== this.kinds) {
      this.kinds = kinds;
      this.key?.remove();
      this.key = kindKey(this.events);
      this.div.before(this.key);
    }
    this.drawing = window.Plotly.react(this.div, traces, layout, PLOT_CONFIG).then(() => {
      this.listen();
      this.onDraw({ rows, aggregated, shown });
    }).finally(() => {
      this.drawing = null;
      if (this.dirty) { this.dirty = false; this.redraw(); }
    });
    return this.drawing;
  }

  listen() {
    if (this.listening) return;
    this.listening = true;
    // Plotly.react does not emit plotly_relayout, so every event here is the user's doing.
    this.div.on('plotly_relayout', (change) => {
      if ('xaxis.range[0]' in change && 'xaxis.range[1]' in change) {
        this.userRange = [Number(change['xaxis.range[0]']), Number(change['xaxis.range[1]'])];
      } else if (Array.isArray(change['xaxis.range'])) {
        this.userRange = change['xaxis.range'].map(Number);
      } else if (change['xaxis.autorange']) {
        this.userRange = null;
      } else {
        return;
      }
      if (this.following) { this.following = false; this.onFollowChange(false); }
      this.redraw();
    });
  }
}

/** Draw `events` once into `div`; resolves with the chart once Plotly has drawn it. */
export async function drawGantt(div, events, options = {}) {
  const chart = new GanttChart(div, options);
  await chart.setEvents(events);
  return chart;
}
