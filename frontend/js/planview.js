// A plan drawn for people: the stages over the layers, replication, per-layer compute coloured
// by stage, communication volume, and the one prediction (trainer/choose.py's, as POST /plans
// answers it): time per step, memory per stage, against data parallel. Used by the plan page
// and by the new-job what-if, so both show the same figures.
//
// Input: PlanPublic from the API ({plan: pipeboard.trainer.plan.Plan.to_dict(), predicted: {...}}) and,
// when available, the profile's per-layer rows ({layers: [{name, forward_ms, backward_ms}]}).

import { barChart } from './charts.js';
import { baseLayout, clear, fmtBytes, fmtNumber, fmtSeconds, h, PLOT_CONFIG, stageColor } from './util.js';

function stat(label, value, id) {
  return h('div', { class: 'stat', id }, h('div', { class: 'value' }, value), h('div', { class: 'label' }, label));
}

/** The prediction's one time per step: back to back under the profile's costs, else one simulated iteration. */
export function stepSeconds(pred) {
  return pred.steady_step_s ?? pred.iteration_time_s;
}

/** The prediction's one memory per stage (the simulated schedule's, recompute counted). */
export function stageMemory(planPublic) {
  return planPublic.predicted?.stage_memory_bytes || null;
}

/** Summary figures of a plan and its simulated schedule: one time per step, one memory per
 * stage, one comparison against data parallel (all from `predicted`, the engine's prediction). */
export function planStats(planPublic) {
  const plan = planPublic.plan || {};
  const pred = planPublic.predicted || {};
  const stages = plan.stages || [];
  const memory = stageMemory(planPublic);
  const speedup = pred.speedup_vs_data_parallel;
  const redo = pred.recompute_stages || [];
  return h('div', { class: 'stats' },
    stat('stages', stages.length),
    stat('workers used', `${plan.workers_used ?? '–'} / ${plan.total_workers ?? '–'}`),
    stat('replication', stages.map((s) => s.replicas).join(' · ') || '–'),
    stat('predicted time / step', fmtSeconds(stepSeconds(pred)), 'stat-step'),
    stat('memory / stage', memory ? memory.map(fmtBytes).join(' · ') : '–', 'stat-memory'),
    stat('vs data parallel', speedup ? `${fmtNumber(speedup)}× ${speedup >= 1 ? 'faster' : 'as fast'}` : '–', 'stat-speedup'),
    stat('recompute', redo.length ? `stage ${redo.join(', ')}` : 'none', 'stat-recompute'),
    stat('bubble', pred.bubble_fraction === undefined ? '–' : `${(pred.bubble_fraction * 100).toFixed(1)}%`),
    // What the simulated schedule does (the service decides where batching applies).
    pred.batch_weight_grads === undefined ? null
      : stat('weight gradients', pred.batch_weight_grads ? 'batched' : 'per backward', 'stat-weight-grads'));
}

/** A strip with one block per stage, as wide as its share of the layers. */
export function stageStrip(plan) {
  const stages = plan.stages || [];
  const total = stages.reduce((n, s) => n + (s.layers?.length || 1), 0) || 1;
  return h('div', { class: 'stage-strip', role: 'img', 'aria-label': `pipeline of ${stages.length} stages` },
    stages.map((s) => h('div', {
      style: `flex: ${(s.layers?.length || 1) / total}; background: ${stageColor(s.index)}`,
      title: `stage ${s.index}: ${s.layers?.length ?? '?'} layers (${s.layers?.[0] ?? ''} … ${s.layers?.[s.layers.length - 1] ?? ''}), ${s.replicas} replica(s), workers ${(s.workers || []).join(', ')}`,
    }, `s${s.index}${s.replicas > 1 ? ` ×${s.replicas}` : ''}`)));
}

/** Per-layer forward+backward time, one bar per layer, coloured by the stage holding it. */
export function layerChart(div, plan, profile) {
  const stageOf = new Map();
  for (const s of plan.stages || []) for (const name of s.layers || []) stageOf.set(name, s.index);
  const layers = (profile?.layers || []).filter((l) => stageOf.has(l.name));
  if (!layers.length) {
    // No per-layer rows: one bar per stage from the plan's own compute times.
    return barChart(div, {
      x: (plan.stages || []).map((s) => `stage ${s.index}`),
      y: (plan.stages || []).map((s) => s.compute_s * 1e3),
      colors: (plan.stages || []).map((s) => stageColor(s.index)),
      title: 'Compute per stage (ms per minibatch)',
    });
  }
  const byStage = new Map();
  layers.forEach((l, i) => {
    const s = stageOf.get(l.name);
    if (!byStage.has(s)) byStage.set(s, { x: [], y: [], text: [] });
    const t = byStage.get(s);
    t.x.push(i);
    t.y.push((l.forward_ms || 0) + (l.backward_ms || 0));
    t.text.push(`${l.name}${l.desc ? ` (${l.desc.slice(0, 60)})` : ''}`);
  });
  const traces = [...byStage.entries()].sort((a, b) => a[0] - b[0]).map(([s, t]) => ({
    type: 'bar', name: `stage ${s}`, x: t.x, y: t.y, text: t.text, marker: { color: stageColor(s) },
    hovertemplate: '%{text}<br>%{y:.3f} ms fwd+bwd<extra>stage ' + s + '</extra>', textposition: 'none',
  }));
  return window.Plotly.react(div, traces, baseLayout({
    title: { text: 'Per-layer compute, coloured by stage', x: 0, font: { size: 14 } },
    height: 280, bargap: 0.05,
    xaxis: { title: { text: 'layer (topological order)' } },
    yaxis: { title: { text: 'ms per minibatch' } },
  }), PLOT_CONFIG);
}

/** The predicted memory per stage, one bar each. */
function memoryBars(div, planPublic) {
  const stages = planPublic.plan?.stages || [];
  const memory = stageMemory(planPublic) || stages.map((s) => s.memory_bytes);
  const redo = new Set(planPublic.predicted?.recompute_stages || []);
  return barChart(div, {
    x: memory.map((_, i) => `s${i}${redo.has(i) ? ' (recompute)' : ''}`),
    y: memory,
    text: memory.map(fmtBytes),
    colors: memory.map((_, i) => stageColor(i)),
    title: 'Predicted memory per stage (the fullest worker holding it)',
    height: 240,
  });
}

function stageBars(div, plan, key, title) {
  const stages = plan.stages || [];
  return barChart(div, {
    x: stages.map((s) => `s${s.index}${s.replicas > 1 ? ` ×${s.replicas}` : ''}`),
    y: stages.map((s) => s[key] ?? 0),
    text: stages.map((s) => fmtBytes(s[key])),
    colors: stages.map((s) => stageColor(s.index)),
    title,
    height: 240,
  });
}

/** Predicted time per step: this plan against data parallel on the same workers, both from the
 * prediction (the same cost model as the step's). */
export function comparisonChart(div, planPublic) {
  const pred = planPublic.predicted || {};
  const step = stepSeconds(pred);
  const dp = pred.data_parallel_step_s ?? (pred.speedup_vs_data_parallel && step ? step * pred.speedup_vs_data_parallel : null);
  const items = [['pipeline (plan)', step, '#2f6fb0'], ['data parallel', dp, '#9aa5b1']].filter(([, t]) => t > 0);
  return barChart(div, {
    x: items.map((i) => i[0]),
    y: items.map((i) => i[1] * 1e3),
    text: items.map((i) => fmtSeconds(i[1])),
    colors: items.map((i) => i[2]),
    title: 'Predicted time per step (ms; lower is faster)',
    height: 240,
  });
}

/** Stage table: layers, replicas, workers, the planner's per-stage times and sizes, and the predicted memory. */
export function stageTable(plan, memory) {
  return h('div', { class: 'table-wrap' }, h('table', { class: 'stage-table' },
    h('thead', {}, h('tr', {}, ['Stage', 'Layers', 'Replicas', 'Workers', 'Compute', 'All-reduce', 'Send', 'Act. out', 'Memory'].map((t, i) => h('th', { class: i >= 4 ? 'num' : '' }, t)))),
    h('tbody', {}, (plan.stages || []).map((s) => h('tr', {},
      h('td', {}, h('span', { class: 'badge', style: `background:${stageColor(s.index)};color:#fff` }, `s${s.index}`)),
      h('td', { title: (s.layers || []).join(', ') }, `${s.layers?.length ?? 0}: ${s.layers?.[0] ?? ''} … ${s.layers?.[s.layers.length - 1] ?? ''}`),
      h('td', {}, s.replicas),
      h('td', {}, (s.workers || []).join(', ')),
      h('td', { class: 'num' }, fmtSeconds(s.compute_s)),
      h('td', { class: 'num' }, fmtSeconds(s.allreduce_s)),
      h('td', { class: 'num' }, fmtSeconds(s.send_s)),
      h('td', { class: 'num' }, fmtBytes(s.activation_bytes_out)),
      h('td', { class: 'num' }, fmtBytes(memory ? memory[s.index] : s.memory_bytes)))))));
}

/** Everything above, into `container`. Resolves when the charts are drawn. */
export async function renderPlan(container, planPublic, profile) {
  const plan = planPublic.plan || {};
  const layerDiv = h('div', { class: 'chart', id: 'plan-layers' });
  const commDiv = h('div', { class: 'chart', id: 'plan-comm' });
  const memDiv = h('div', { class: 'chart', id: 'plan-memory' });
  const tputDiv = h('div', { class: 'chart', id: 'plan-throughput' });
  container.append(...[
    planStats(planPublic),
    stageStrip(plan),
    plan.exact === false ? h('p', { class: 'muted small' }, `Planned over a linearised topological order (${plan.states} states): too many antichains for the exact search.`) : null,
    h('div', { class: 'panel' }, layerDiv),
    h('div', { class: 'grid2' }, h('div', { class: 'panel' }, commDiv), h('div', { class: 'panel' }, memDiv)),
    h('div', { class: 'grid2' }, h('div', { class: 'panel' }, tputDiv),
      h('div', { class: 'panel' }, stageTable(plan, (stageMemory(planPublic) || []).length === (plan.stages || []).length ? stageMemory(planPublic) : null)))].filter(Boolean));
  await Promise.all([
    layerChart(layerDiv, plan, profile),
    stageBars(commDiv, plan, 'activation_bytes_out', (plan.stages || []).length > 1 ? 'Communication: activation bytes out per minibatch' : 'Communication: one stage, nothing crosses a cut'),
    memoryBars(memDiv, planPublic),
    comparisonChart(tputDiv, planPublic),
  ]);
}

/** The new-job card's what-if: the same figures as the plan page, its Gantt and a link to it. */
export async function renderWhatIf(box, planPublic, drawGantt) {
  const gantt = h('div', { class: 'chart', id: 'what-if-gantt' });
  const versus = h('div', { class: 'chart', id: 'what-if-throughput' });
  clear(box).append(planStats(planPublic), stageStrip(planPublic.plan || {}),
    h('h3', {}, 'Predicted Gantt (one iteration, fill and drain)'), gantt, versus,
    h('p', {}, h('a', { href: `#/plans/${planPublic.id}` }, 'Open the full plan view')));
  await Promise.all([drawGantt(gantt, planPublic.predicted?.timeline || []), comparisonChart(versus, planPublic)]);
}
