// "Choose for me": the tuner (POST /tune) for the new-job form. It follows the model's profiling
// jobs (one per microbatch size not cached yet) and shows the ranked candidates: those that fit
// the memory cap, fastest per sample first, then those that do not and why. Clicking a row hands
// the candidate to the form (`onPick`), which fills its fields.

import { getJob, request } from './api.js';
import { clear, h, notice } from './util.js';

const COUNTS = [1, 2, 4, 8, 16]; // microbatch counts tried (those dividing the batch)
const POLL_MS = 1000;

const wait = (ms, signal) => new Promise((resolve, reject) => {
  const timer = setTimeout(resolve, ms);
  signal?.addEventListener('abort', () => { clearTimeout(timer); reject(new DOMException('aborted', 'AbortError')); });
});

/** The counts of COUNTS that divide `batchSize`. */
export function countsFor(batchSize) {
  return COUNTS.filter((m) => batchSize % m === 0);
}

/** POST /tune's body from a job specification (pages/newjob.js's spec()): its model, workers,
 * batch and memory cap; the microbatch counts that divide the batch. Throws naming the field. */
export function tuneBody(spec) {
  if (spec.layout.levels) throw new Error('layout.workers: choose for me tunes local worker processes (Workers from)');
  const body = { model: spec.model.name, model_args: spec.model.args, workers: spec.layout.workers,
    batch_size: spec.model.batch_size, microbatches: countsFor(spec.model.batch_size) };
  if (spec.layout.memory_bytes) body.memory_per_worker_bytes = spec.layout.memory_bytes;
  return body;
}

/** POST /tune, following each 202's profiling job to its end and asking again. */
export async function tuneFollowingProfiling(body, signal, say) {
  let answer = await request('POST', '/tune', { body, signal });
  while (answer && answer.job && !answer.candidates) {
    let job = answer.job;
    const started = Date.now();
    while (!['succeeded', 'failed', 'cancelled'].includes(job.status)) {
      const size = job.spec?.model?.batch_size;
      say(`Profiling ${body.model} at microbatch size ${size} on a worker (job #${job.id}, ${job.status}, `
        + `${Math.round((Date.now() - started) / 1000)} s); the candidates follow.`);
      await wait(POLL_MS, signal);
      job = await getJob(job.id, signal);
    }
    if (job.status !== 'succeeded') throw new Error(`profiling ${body.model} (job #${job.id}) ${job.status}: ${job.error || ''}`);
    answer = await request('POST', '/tune', { body, signal });
  }
  return answer;
}

const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;

/** "6+6x2+4": layers per stage, replicas after an x. */
export function splitText(plan) {
  return plan.stages.map((st) => `${st.layers.length}${st.replicas > 1 ? `x${st.replicas}` : ''}`).join('+');
}

/** "none", "all" or the stage numbers that recompute. */
export function recomputeText(flags) {
  if (!flags.some(Boolean)) return 'none';
  if (flags.every(Boolean)) return 'all';
  return flags.map((on, i) => (on ? i : null)).filter((i) => i !== null).join(',');
}

/** The ranked table; each row a button that calls onPick(candidate). */
export function tuneTable(result, onPick) {
  const rows = result.candidates.map((c, i) => {
    const fits = c.fits ? 'fits' : `does not fit: ${c.why}`;
    const row = h('tr', { class: c.fits ? 'tune-fits' : 'tune-over', tabindex: '0', role: 'button',
      'data-rank': String(i + 1), title: `Fill the form with candidate ${i + 1}` },
    h('td', {}, String(i + 1)),
    h('td', {}, c.schedule + (c.chunks > 1 ? ` (${c.chunks} chunks)` : '')),
    h('td', {}, `${c.plan.method} ${splitText(c.plan)}`),
    h('td', { class: 'num' }, String(c.microbatches)),
    h('td', {}, recomputeText(c.recompute)),
    h('td', { class: 'num' }, `${(c.predicted_step_s * 1e3).toFixed(2)} ms`),
    h('td', { class: 'num' }, `${(c.predicted_time_per_sample_s * 1e6).toFixed(1)} µs`),
    h('td', { class: 'num' }, mib(c.predicted_memory_bytes)),
    h('td', {}, fits));
    const pick = () => {
      for (const other of row.parentNode?.querySelectorAll('tr.picked') || []) other.classList.remove('picked');
      row.classList.add('picked');
      onPick(c);
    };
    row.addEventListener('click', pick);
    row.addEventListener('keydown', (event) => { if (event.key === 'Enter' || event.key === ' ') { event.preventDefault(); pick(); } });
    return row;
  });
  const fitting = result.candidates.filter((c) => c.fits).length;
  const cap = result.memory_per_worker_bytes;
  const summary = `${result.candidates.length} candidates, ${fitting} fit${cap ? ` under ${mib(cap)} per worker` : ''}`
    + `${result.skipped.length ? `; ${result.skipped.length} ${result.skipped.length === 1 ? 'combination' : 'combinations'} cannot run (e.g. ${result.skipped[0].candidate}: ${result.skipped[0].why})` : ''}.`
    + ' Click a row to fill the form.';
  return h('div', { id: 'tune-result' },
    h('p', { class: 'hint' }, summary),
    h('div', { class: 'table-wrap' }, h('table', { id: 'tune-table' },
      h('thead', {}, h('tr', {}, ...['#', 'schedule', 'split', 'microbatches', 'recompute', 'step', 'per sample',
        'memory / worker', 'fits'].map((t) => h('th', {}, t)))),
      h('tbody', {}, ...rows))));
}

/** Run the tuner for `body` into `box` (progress, then the table or the error). */
export async function chooseForMe(body, box, signal, onPick) {
  const progress = notice('loading', 'Tuning…');
  clear(box).append(progress);
  try {
    const result = await tuneFollowingProfiling(body, signal, (text) => { progress.textContent = text; });
    clear(box).append(tuneTable(result, onPick));
    return result;
  } catch (err) {
    if (err.name === 'AbortError') return null;
    clear(box).append(notice('error', `No choice: ${err.message}`));
    return null;
  }
}

/** A candidate into the new-job form's controls (`els` of pages/newjob.js): planner method (dp's
 * split is the runtime's own: any method), schedule, microbatches, recompute (a list of stages
 * becomes an option of its own, its value the list as JSON). */
export function fillForm(els, c) {
  const planner = [...els.method.options].some((o) => o.value === c.plan.method);
  els.method.value = planner ? c.plan.method : 'pipedream'; // a method the form has no option for (dp's own split)
  els.schedule.value = c.schedule;
  els.microbatches.value = c.microbatches;
  const stages = c.recompute.map((on, i) => (on ? i : null)).filter((i) => i !== null);
  const value = stages.length === 0 ? 'none' : stages.length === c.recompute.length ? 'all' : JSON.stringify(stages);
  if (![...els.recompute.options].some((o) => o.value === value)) {
    els.recompute.append(h('option', { value }, `stages ${stages.join(', ')}`));
  }
  els.recompute.value = value;
}
