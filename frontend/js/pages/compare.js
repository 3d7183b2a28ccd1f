// Compare runs: pick jobs, overlay their time-to-accuracy curves (metric against wall time) and
// loss, and put their throughput side by side (e.g. pipedream against data parallel, or one
// schedule against another). The selection lives in the URL (#/compare?ids=3,5) to share it.

import { getMetrics, listJobs } from '../api.js';
import { barChart, lineChart, series } from '../charts.js';
import { clear, h, navigate, notice, STAGE_COLORS } from '../util.js';

// Both named: the planner method and the schedule share the name pipedream.
const label = (j) => `#${j.id} ${j.name} (planner ${j.spec.layout?.method || '?'}, schedule ${j.schedule || '?'})`;

export async function render(container, { ids = '' }) {
  const chosen = new Set(ids.split(',').filter(Boolean).map(Number));
  const picker = h('fieldset', { id: 'compare-picker' }, h('legend', {}, 'Runs'), notice('loading', 'Loading jobs…'));
  const ttaDiv = h('div', { class: 'chart', id: 'compare-tta' });
  const lossDiv = h('div', { class: 'chart', id: 'compare-loss' });
  const tputDiv = h('div', { class: 'chart', id: 'compare-throughput' });
  const charts = h('div', {}, h('div', { class: 'panel' }, ttaDiv), h('div', { class: 'grid2' }, h('div', { class: 'panel' }, tputDiv), h('div', { class: 'panel' }, lossDiv)));
  container.append(h('h1', {}, 'Compare runs'), h('div', { class: 'panel' }, picker), charts);

  let jobs;
  try {
    jobs = (await listJobs({ limit: 100 })).data.filter((j) => j.status !== 'queued');
  } catch (err) {
    clear(picker).append(h('legend', {}, 'Runs'), notice('error', `Could not list jobs: ${err.message}`));
    return null;
  }
  clear(picker).append(h('legend', {}, 'Runs'));
  if (!jobs.length) {
    picker.append(notice('empty', 'No runs to compare yet. ', h('a', { href: '#/new' }, 'Submit a job.')));
    charts.hidden = true;
    return null;
  }
  picker.append(h('div', { class: 'checklist' }, jobs.map((j) => h('label', {},
    h('input', { type: 'checkbox', value: j.id, checked: chosen.has(j.id), onchange: (e) => {
      if (e.target.checked) chosen.add(j.id); else chosen.delete(j.id);
      navigate(`/compare?ids=${[...chosen].sort((a, b) => a - b).join(',')}`);
    } }), label(j), h('span', { class: `badge status-${j.status}` }, j.status)))));

  const picked = jobs.filter((j) => chosen.has(j.id));
  if (!picked.length) {
    charts.replaceWith(notice('empty', 'Pick two or more runs above to overlay them.'));
    return null;
  }
  const metrics = await Promise.all(picked.map((j) => getMetrics(j.id).catch(() => [])));
  const color = (i) => STAGE_COLORS[i % STAGE_COLORS.length];
  const metricName = picked.find((j) => j.metricName)?.metricName || 'metric';
  await Promise.all([
    lineChart(ttaDiv, picked.map((j, i) => ({ name: label(j), ...series(metrics[i], 'metric'), line: { color: color(i) } })),
      { title: `Time to accuracy: ${metricName} against wall time`, yTitle: metricName, empty: 'pick runs with metric points' }),
    lineChart(lossDiv, picked.map((j, i) => ({ name: label(j), ...series(metrics[i], 'loss'), line: { color: color(i) } })),
      { title: 'Loss against wall time', yTitle: 'loss', empty: 'pick runs' }),
    barChart(tputDiv, {
      x: picked.map((j) => `#${j.id} ${j.schedule}`),
      y: picked.map((j, i) => j.samplesPerS ?? median(series(metrics[i], 'samples_per_s').y)),
      colors: picked.map((_, i) => color(i)),
      title: 'Throughput (samples/s)',
      yTitle: 'samples/s',
    }),
  ]);
  return null;
}

function median(values) {
  const sorted = values.filter((v) => v !== null).sort((a, b) => a - b); // null: a break between attempts
  if (!sorted.length) return null;
  return sorted[Math.floor(sorted.length / 2)];
}
