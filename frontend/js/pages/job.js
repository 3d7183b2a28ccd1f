// Job detail: live pipeline Gantt (following the newest steps, with pause and zoom), predicted
// Gantt beside it with the prediction's fidelity (the server's `fidelity`: predicted, measured and
// corrected time per step, the terms the correction moved), utilisation, samples/s, loss and metric over wall
// time, the error of a failed run, Chrome trace download and "Open in Perfetto". A job retried
// after a fault shows its attempts; the charts mark where each later attempt begins, and the
// steps it trains again replace the earlier attempt's (its `attempt` event says from which step).
//
// A queued or running job replays its event log from the start over SSE (so nothing is missed
// between a snapshot and the stream) and then follows it; a finished job is read from the
// timeline and metrics routes. Redraws happen once per batch of messages, never per message.

import { cancelJob, eventsUrl, fetchTrace, getJob, getPlan, getTimeline, normalizeMetric, request, retryJob } from '../api.js';
import { attemptMarks, lineChart, series, thinPoints, utilisationFromMetrics, utilisationFromTimeline } from '../charts.js';
import { GanttChart } from '../gantt.js';
import { openInPerfetto, saveBytes } from '../perfetto.js';
import { openStream } from '../sse.js';
import { clear, durationBetween, fmtBytes, fmtNumber, fmtPercent, fmtSeconds, h, notice, statusBadge } from '../util.js';

const FINAL = new Set(['succeeded', 'failed', 'cancelled']);
const WINDOWS = [[1, 'last step'], [3, 'last 3 steps'], [10, 'last 10 steps'], [0, 'all']];
// Points per series the charts are given, whatever the job's length: more than a chart has pixels
// across. A finished job's are thinned by the server; a running job's stream is thinned here past twice it.
const CHART_POINTS = 1000;

// One action of one attempt: what a stream message and a timeline read of the same action share.
const actionKey = (e) => `${e.attempt ?? 1}/${e.step}/${e.worker}/${e.stage}/${e.replica}/${e.microbatch}/${e.kind}`;

const fromCompact = (r, attempt = 1, hosts = {}) => ({ worker: r[0], stage: r[1], replica: r[2], microbatch: r[3], kind: r[4], start: r[5], end: r[6], step: r[7], attempt, host: hosts[r[0]] });

export async function render(container, { id }) {
  const state = { job: null, metrics: [], metricSeqs: new Set(), readActions: new Set(), predicted: [], predictedTried: 0, stream: null, closed: false, hosts: {}, fidelity: null };
  let job;
  try {
    job = await getJob(id);
  } catch (err) {
    container.append(h('h1', {}, `Job ${id}`), notice('error', `Could not load job ${id}: ${err.message}`));
    return null;
  }

  const header = h('div', { class: 'toolbar' });
  const errorBox = h('div', { id: 'job-error' });
  const stats = h('div', { class: 'stats', id: 'job-stats' });
  const attemptsBox = h('p', { class: 'small', id: 'job-attempts' });
  const memoryBox = h('p', { class: 'small', id: 'job-memory' });
  const progress = h('p', { class: 'muted small', id: 'job-progress', 'aria-live': 'polite' });
  const liveDiv = h('div', { class: 'chart', id: 'gantt-live' });
  const predDiv = h('div', { class: 'chart', id: 'gantt-predicted' });
  const predNote = h('p', { class: 'small', id: 'prediction-error' });
  const utilDiv = h('div', { class: 'chart', id: 'chart-utilisation' });
  const speedDiv = h('div', { class: 'chart', id: 'chart-throughput' });
  const lossDiv = h('div', { class: 'chart', id: 'chart-loss' });
  const metricDiv = h('div', { class: 'chart', id: 'chart-metric' });

  const followBtn = h('button', { type: 'button', id: 'gantt-follow', 'aria-pressed': 'true' }, 'Following newest');
  const windowSelect = h('select', { id: 'gantt-window', 'aria-label': 'Gantt window' }, WINDOWS.map(([n, t]) => h('option', { value: n, selected: n === 3 }, t)));
  const live = new GanttChart(liveDiv, {
    windowSteps: 3,
    following: true,
    onFollowChange: (on) => { followBtn.setAttribute('aria-pressed', String(on)); followBtn.textContent = on ? 'Following newest' : 'Paused: follow newest'; },
  });
  followBtn.addEventListener('click', () => live.follow(!live.following));
  windowSelect.addEventListener('change', () => live.setWindow(Number(windowSelect.value)));
  const predicted = new GanttChart(predDiv, {});

  // A long job keeps every action only in windows (docs/storage.md): say which steps have them, let the
  // Gantt show any one of them, and let a running job be asked to record its next steps in full.
  const detailNote = h('p', { class: 'small', id: 'detail-windows', 'aria-live': 'polite' });
  const detailSelect = h('select', { id: 'detail-window', 'aria-label': 'Recorded window' });
  const recordBtn = h('button', { type: 'button', id: 'record-detail' }, 'Record the next 20 steps');
  const diskNote = h('p', { class: 'muted small', id: 'job-disk' });
  const fmtRange = ([a, b]) => (a === b ? `${a}` : `${a}–${b}`);
  async function loadWindows() {
    try {
      const [windows, disk] = await Promise.all([request('GET', `/jobs/${id}/detail`), request('GET', `/jobs/${id}/storage`)]);
      const ranges = windows.detail_steps || [];
      const upTo = windows.last_step == null ? 'none yet' : `up to step ${windows.last_step}`;
      detailNote.textContent = ranges.length
        ? `Full actions recorded for steps ${ranges.map(fmtRange).join(', ')}; every step has its summary (${upTo}).`
        : `No step has its full actions recorded yet; every step has its summary (${upTo}).`;
      const chosen = detailSelect.value;
      clear(detailSelect).append(h('option', { value: '' }, 'Windows: newest'),
        ...ranges.map((r) => h('option', { value: r.join(':'), selected: r.join(':') === chosen }, `steps ${fmtRange(r)}`)));
      diskNote.textContent = `Disk: ${fmtNumber(disk.bytes / 1e6)} MB in ${fmtNumber(disk.rows)} rows (${disk.tables.timeline_events.rows} actions, ${disk.metric_points} step points).`;
    } catch (err) {
      detailNote.textContent = `Could not load the recorded windows: ${err.message}`;
    }
  }
  detailSelect.addEventListener('change', async () => {
    if (!detailSelect.value) return;
    const [from, to] = detailSelect.value.split(':').map(Number);
    // the whole chosen window in view, not its last steps nor an earlier zoom
    windowSelect.value = '0';
    live.windowSteps = 0;
    live.userRange = null;
    live.follow(false);
    await live.setEvents(await getTimeline(id, { step_from: from, step_to: to, limit: 100000 }));
  });
  recordBtn.addEventListener('click', async () => {
    recordBtn.disabled = true;
    try {
      await request('POST', `/jobs/${id}/detail`, { body: { steps: 20 } });
      detailNote.textContent = 'Asked: the job records its next 20 steps in full (within a step or two).';
      setTimeout(loadWindows, 3000);
    } catch (err) {
      detailNote.textContent = `Could not ask for detail: ${err.message}`;
    } finally {
      recordBtn.disabled = false;
    }
  });

  container.append(header, errorBox, stats, attemptsBox, memoryBox, progress,
    h('div', { class: 'grid2' },
      h('section', { class: 'panel', 'aria-labelledby': 'h-live' },
        h('div', { class: 'toolbar' }, h('h2', { id: 'h-live', style: 'margin:0' }, 'Measured pipeline'), h('span', { class: 'spacer' }), followBtn, windowSelect, detailSelect, recordBtn),
        h('p', { class: 'muted small' }, 'Drag to zoom (pauses following), double-click to see everything.'), detailNote, liveDiv, diskNote),
      h('section', { class: 'panel', 'aria-labelledby': 'h-pred' },
        h('h2', { id: 'h-pred', style: 'margin-top:0' }, 'Predicted (simulator)'), predNote, predDiv)),
    h('div', { class: 'grid2' },
      h('div', { class: 'panel' }, utilDiv), h('div', { class: 'panel' }, speedDiv),
      h('div', { class: 'panel' }, lossDiv), h('div', { class: 'panel' }, metricDiv)));

  function drawHeader() {
    const j = state.job;
    recordBtn.hidden = j.status !== 'running';
    clear(header).append(...[
      h('h1', { style: 'margin:0' }, `#${j.id} ${j.name}`), statusBadge(j.status),
      h('span', { class: 'muted', id: 'job-subtitle' }, `${j.model} · ${j.schedule} · ${j.spec.layout?.microbatches ?? '?'} microbatches · batch ${j.spec.model?.batch_size ?? '?'}`
        + (j.submitted_by ? ` · submitted by ${j.submitted_by}` : '')),
      h('span', { class: 'spacer' }),
      j.plan_id ? h('a', { class: 'button', href: `#/plans/${j.plan_id}` }, 'Plan') : null,
      ['queued', 'running'].includes(j.status) ? h('button', { type: 'button', class: 'danger', onclick: () => act(cancelJob) }, 'Cancel') : null,
      ['failed', 'cancelled'].includes(j.status) ? h('button', { type: 'button', onclick: () => act(retryJob) }, 'Retry') : null,
      h('button', { type: 'button', id: 'download-trace', onclick: downloadTrace }, 'Download trace'),
      h('button', { type: 'button', id: 'open-perfetto', onclick: perfetto }, 'Open in Perfetto')].filter(Boolean));
    clear(errorBox);
    if (j.status === 'failed' && j.error) errorBox.append(notice('error', `Failed: ${j.error}`));
    // a cuda job placement could not place yet says why (app/services/placement.py); any other waits for a worker
    if (j.status === 'queued') {
      const wait = notice('loading', `Queued${j.queuePosition ? `, position ${j.queuePosition}` : ''}: ${j.waiting || 'waiting for a worker'}.`);
      wait.id = 'job-waiting';
      errorBox.append(wait);
    }
    drawStats();
  }

  function drawStats() {
    const j = state.job;
    const lastSpeed = series(state.metrics, 'samples_per_s').y.at(-1);
    const lastTokens = series(state.metrics, 'tokens_per_s').y.at(-1);
    const metric = series(state.metrics, 'metric').y;
    clear(stats).append(...[
      ['status', j.status],
      ['samples/s', fmtNumber(j.samplesPerS ?? lastSpeed)],
      ...(lastTokens != null ? [['tokens/s', fmtNumber(j.summary?.tokens_per_s ?? lastTokens)]] : []),
      [`best ${j.metricName || 'metric'}`, fmtNumber(j.bestMetric ?? metric.at(-1))],
      ['steps', j.summary?.steps ?? state.metrics.at(-1)?.step ?? '–'],
      ...(j.summary?.target != null ? [['time to target', j.summary.reached_target ? fmtSeconds(j.summary.time_to_target_s) : 'not reached']] : []),
      ['duration', fmtSeconds(durationBetween(j.started_at, j.finished_at))],
      ['attempt', j.attempt ?? 0],
    ].map(([label, value]) => h('div', { class: 'stat' }, h('div', { class: 'value' }, value), h('div', { class: 'label' }, label))));
    drawAttempts();
    drawMemory();
  }

  /** The run's memory per stage: memory_model's predicted peak beside the measured one, and how it was measured. */
  function drawMemory() {
    const m = state.job.summary?.memory || [];
    clear(memoryBox);
    if (!m.length) return;
    const how = { cuda_max_allocated: 'CUDA allocator peak', counted: 'tensor bytes counted', rss_peak: 'process peak RSS', rss: 'process RSS' }[state.job.summary.memory_source] || 'measured';
    memoryBox.append(h('strong', {}, 'Memory per stage: '), m.map((e) => `stage ${e.stage} predicted ${e.predicted_bytes == null ? '?' : fmtBytes(e.predicted_bytes)}, `
      + `measured ${e.measured_bytes == null ? '?' : fmtBytes(e.measured_bytes)}`).join(' · ') + ` (${how}).`);
  }

  /** One line per attempt once there is more than one: how it started, where from, on which hosts, how it ended. */
  function drawAttempts() {
    const list = state.job.attempts || [];
    clear(attemptsBox);
    if (list.length < 2) return;
    attemptsBox.append(h('strong', {}, 'Attempts: '), ...list.map((a, i) => h('span', { class: 'attempt', 'data-attempt': a.attempt },
      `${i ? ' · ' : ''}${a.attempt} ${a.trigger === 'auto' ? '(automatic retry) ' : a.trigger === 'manual' ? '(retry) ' : ''}${a.status}`
      + (a.resume_step ? `, from step ${a.resume_step}` : a.resume_step === 0 ? ', from the start' : '')
      + (a.nodes?.length ? ` on ${a.nodes.join(', ')}` : '')
      + (a.error ? `: ${a.error.split('\n')[0]}` : ''))));
  }

  /** A new attempt trains from `resume_step`: what earlier attempts measured after it is measured again. */
  function startAttempt(d) {
    state.hosts[d.attempt] = d.hosts || {};
    const superseded = (step, attempt, firstStep) => (attempt ?? 1) < d.attempt && step >= firstStep;
    state.metrics = state.metrics.filter((p) => !superseded(p.step, p.attempt, d.resume_step + 1));
    const kept = live.events.filter((e) => !superseded(e.step, e.attempt, d.resume_step));
    if (kept.length !== live.events.length) live.setEvents(kept);
  }

  async function act(fn) {
    const seen = state.job.last_event_seq || 0; // the page holds the job up to here
    try { await fn(id); } catch (err) { errorBox.prepend(notice('error', err.message)); }
    await refreshJob();
    if (!FINAL.has(state.job.status) && !state.stream) follow(seen);
  }

  async function downloadTrace() {
    try { saveBytes(await fetchTrace(id), `job-${id}.trace.json`); } catch (err) { errorBox.prepend(notice('error', `Trace: ${err.message}`)); }
  }

  function perfetto() {
    openInPerfetto(() => fetchTrace(id), `pipeboard job ${id}`).catch((err) => errorBox.prepend(notice('error', `Perfetto: ${err.message}`)));
  }

  function drawCharts() {
    drawUtilisation();
    const marks = attemptMarks(state.job.attempts);
    // tokens/s beside samples/s (its own axis) when the run reports them
    const tokens = series(state.metrics, 'tokens_per_s');
    const speed = [{ name: 'samples/s', ...series(state.metrics, 'samples_per_s') }];
    if (tokens.x.length) speed.push({ name: 'tokens/s', ...tokens, yaxis: 'y2' });
    lineChart(speedDiv, speed, { title: tokens.x.length ? 'Samples and tokens per second' : 'Samples per second', yTitle: 'samples/s',
      y2Title: tokens.x.length ? 'tokens/s' : undefined, marks });
    lineChart(lossDiv, [{ name: 'loss', ...series(state.metrics, 'loss') }], { title: 'Loss', yTitle: 'loss', marks });
    lineChart(metricDiv, [{ name: state.job.metricName || 'metric', ...series(state.metrics, 'metric') }], { title: `${state.job.metricName || 'Metric'} over time (time to accuracy)`, yTitle: state.job.metricName || 'metric', marks });
    drawPredictionError();
  }

  /** From the metric points when the run reports utilisation, else from the Gantt's actions. */
  function drawUtilisation() {
    const util = utilisationFromMetrics(state.metrics);
    lineChart(utilDiv, util.length ? util : utilisationFromTimeline(live.events),
      { title: 'Utilisation per stage', yTitle: 'busy fraction', yRange: [0, 1.05], marks: attemptMarks(state.job.attempts) });
  }

  /** The server's figures (job.fidelity, or the newest `fidelity` event while it runs): the plan's
   * predicted time per step, the measured steady-state time per step (the slope of step completion
   * times over the second half of the steps, computed by the server), their error, and the
   * prediction re-fitted after the first steps with the terms it moved. Nothing is computed here. */
  function drawPredictionError() {
    const f = state.fidelity || state.job.fidelity;
    clear(predNote);
    if (!f || f.predicted_step_s == null) {
      predNote.textContent = FINAL.has(state.job.status) ? 'No prediction for this job.' : 'The prediction appears once the job has been planned.';
      return;
    }
    const pct = (e) => `${e >= 0 ? '+' : ''}${fmtPercent(e)}`;
    const basis = f.basis === 'steady_step_s' ? 'steady state' : 'one iteration, fill and drain included';
    const line = [`Predicted ${fmtSeconds(f.predicted_step_s)} per step (${basis})`];
    if (f.measured_step_s == null) line.push('measured: waiting for steps');
    else {
      line.push(`measured ${fmtSeconds(f.measured_step_s)}${f.live ? ' so far' : ''} (steady state over ${f.measured_steps ?? '?'} steps)`);
      line.push(`prediction error ${pct(f.error)}`);
    }
    predNote.append(h('span', { id: 'fidelity-apriori' }, `${line.join(', ')}.`));
    if (f.device_note) predNote.append(h('br'), h('span', { id: 'fidelity-device' }, `Note: ${f.device_note}.`));
    if (f.corrected_step_s != null) {
      const moved = Object.entries(f.terms || {}).filter(([, t]) => t.moved)
        .map(([name, t]) => (t.factor != null ? `${name} ×${fmtNumber(t.factor, 2)}` : `${name} +${fmtSeconds(t.measured_s)} per action`));
      predNote.append(h('br'), h('span', { id: 'fidelity-corrected' },
        `Corrected after step ${f.corrected_after_step}: ${fmtSeconds(f.corrected_step_s)} per step`
        + (f.corrected_error != null ? `, error ${pct(f.corrected_error)}` : '')
        + (moved.length ? `; moved: ${moved.join(', ')}.` : '; no term moved.')));
    }
  }

  function addMetrics(points) {
    for (const p of points.map(normalizeMetric)) {
      if (p.seq !== undefined) {
        if (state.metricSeqs.has(p.seq)) continue;
        state.metricSeqs.add(p.seq);
      }
      state.metrics.push(p);
    }
    if (state.metrics.length > 2 * CHART_POINTS) state.metrics = thinPoints(state.metrics, CHART_POINTS);
  }

  async function refreshJob() {
    try {
      state.job = await getJob(id);
      if (state.job.fidelity && !state.job.fidelity.live) state.fidelity = state.job.fidelity;
      drawHeader();
    } catch (err) {
      errorBox.prepend(notice('error', `Could not refresh the job: ${err.message}`));
    }
  }

  async function onBatch(messages) {
    const events = [];
    let metricsChanged = false;
    let statusChanged = false;
    for (const m of messages) {
      const d = m.data || {};
      if (m.type === 'timeline') {
        if (Array.isArray(d.events)) events.push(...d.events.map((r) => fromCompact(r, d.attempt ?? 1, state.hosts[d.attempt ?? 1])));
        else if (d.first_seq) {
          // Too big to ride along in the message: fetch exactly that range.
          getTimeline(id, { after_seq: d.first_seq - 1, limit: Math.min(200000, d.count || 20000) })
            .then((rows) => { live.add(rows); drawCharts(); }).catch(() => {});
        }
      } else if (m.type === 'metrics') {
        addMetrics(d.points || []);
        metricsChanged = true;
      } else if (m.type === 'attempt') {
        if (events.length) { live.add(events.splice(0)); }
        startAttempt(d);
        progress.textContent = d.message || `attempt ${d.attempt}`;
        statusChanged = true;
      } else if (m.type === 'status' || m.type === 'summary' || m.type === 'end') {
        statusChanged = true;
      } else if (m.type === 'fidelity') {
        state.fidelity = d;
      } else if (m.type === 'progress') {
        progress.textContent = [d.phase, d.message].filter(Boolean).join(': ');
      }
    }
    // actions of the window being recorded as the page loaded may come twice: read, then streamed
    const fresh = state.readActions.size ? events.filter((e) => !state.readActions.has(actionKey(e))) : events;
    if (fresh.length) live.add(fresh);
    if (statusChanged) await refreshJob(); // first: the summary names the metric
    else drawStats();
    if (events.length || metricsChanged || statusChanged) drawCharts();
    // The plan (and its prediction) appears once the run has profiled and planned: ask again,
    // at most every few seconds, until there is one.
    if (!state.predicted.length && Date.now() - state.predictedTried > 3000) loadPredicted();
  }

  /** The job's stream, after event `after` (0: from its start). */
  function follow(after = 0) {
    state.stream?.close();
    state.stream = openStream(eventsUrl(id), {
      lastEventId: after > 0 ? String(after) : null,
      onBatch,
      isTerminal: (m) => m.type === 'end',
      onState: (s) => {
        if (s === 'reconnecting') progress.textContent = 'Connection lost: reconnecting (nothing will be missed)…';
        if (s === 'closed') state.stream = null;
      },
    });
  }

  async function loadPredicted() {
    state.predictedTried = Date.now();
    try {
      let rows = await getTimeline(id, { source: 'predicted', limit: 20000 });
      if (state.job.plan_id) {
        const plan = await getPlan(state.job.plan_id);
        if (!rows.length) rows = plan.predicted?.timeline || [];
      }
      state.predicted = rows;
      await predicted.setEvents(rows);
      drawPredictionError();
    } catch (err) {
      predNote.textContent = `No predicted timeline: ${err.message}`;
    }
  }

  state.job = job;
  drawHeader();
  // Running or finished, the page reads what is stored as it is: every first request at once, each chart
  // drawn once its data is in: the metric series (thinned by the server to CHART_POINTS a series), the
  // newest recorded window's actions (a long job keeps actions in windows, docs/storage.md; the others are
  // a choice away, #detail-window), the prediction. A running job's stream then starts after the event the
  // job was read at: replaying every event since its start would take as long as the job is old.
  const resumeAfter = job.last_event_seq || 0;
  for (const a of job.attempts || []) state.hosts[a.attempt] = a.hosts || {}; // the stream's `attempt` messages come before resumeAfter
  const failed = (what) => (err) => errorBox.append(notice('error', `Could not load the ${what}: ${err.message}`));
  const metricsDone = request('GET', `/jobs/${id}/metrics`, { query: { limit: CHART_POINTS } })
    .then((m) => { addMetrics(m.points || []); drawCharts(); drawStats(); }, failed('metrics'));
  const timelineDone = request('GET', `/jobs/${id}/detail`)
    .then((w) => { const newest = (w.detail_steps || []).at(-1); return getTimeline(id, newest ? { step_from: newest[0], step_to: newest[1], limit: 100000 } : { limit: 100000 }); })
    .then((rows) => { if (!FINAL.has(job.status)) state.readActions = new Set(rows.map(actionKey)); return live.setEvents(rows); },
      (err) => { failed('timeline')(err); return live.setEvents([]); });
  await Promise.all([loadPredicted(), metricsDone, timelineDone]);
  // utilisation from the actions once they are in, for a run that reports none
  if (!utilisationFromMetrics(state.metrics).length) drawUtilisation();
  if (!FINAL.has(job.status)) follow(resumeAfter);
  await loadWindows();
  // Durations of a running job tick even when no event arrives.
  const ticker = setInterval(() => { if (!FINAL.has(state.job.status)) drawStats(); }, 1000);
  const windowsTicker = setInterval(() => { if (!FINAL.has(state.job.status)) loadWindows(); }, 10000);
  return () => { state.closed = true; clearInterval(ticker); clearInterval(windowsTicker); state.stream?.close(); };
}
