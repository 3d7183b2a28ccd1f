// Jobs: a table refreshed every couple of seconds (there is no all-jobs stream), with a status
// filter, a name filter, paging, and cancel / retry buttons.

import { cancelJob, listJobs, retryJob } from '../api.js';
import { clear, durationBetween, fmtNumber, fmtSeconds, h, notice, statusBadge } from '../util.js';

const REFRESH_MS = 2000;
const PAGE = 25;
const STATUSES = ['', 'queued', 'running', 'succeeded', 'failed', 'cancelled'];

export function render(container, params) {
  const state = { status: params.status || '', text: params.q || '', offset: 0, timer: null, controller: null, closed: false };

  const statusSelect = h('select', { id: 'filter-status', onchange: () => { state.status = statusSelect.value; state.offset = 0; refresh(); } },
    STATUSES.map((s) => h('option', { value: s, selected: s === state.status }, s || 'any status')));
  const textInput = h('input', { id: 'filter-text', type: 'search', placeholder: 'name or model', value: state.text,
    oninput: () => { state.text = textInput.value.trim().toLowerCase(); draw(); } });
  const body = h('div', { class: 'jobs-body' }, notice('loading', 'Loading jobs…'));
  const pager = h('div', { class: 'toolbar' });
  let last = null;

  container.append(
    h('div', { class: 'toolbar' },
      h('h1', { style: 'margin:0' }, 'Jobs'),
      h('span', { class: 'spacer' }),
      h('a', { class: 'button primary', href: '#/new' }, 'New job')),
    h('div', { class: 'toolbar', role: 'search' },
      h('div', {}, h('label', { for: 'filter-status' }, 'Status'), statusSelect),
      h('div', {}, h('label', { for: 'filter-text' }, 'Filter'), textInput)),
    body, pager);

  async function act(fn, job, button) {
    button.disabled = true;
    try {
      await fn(job.id);
    } catch (err) {
      body.prepend(notice('error', `${button.textContent} job ${job.id}: ${err.message}`));
    }
    refresh();
  }

  function actions(job) {
    const cell = h('td', { class: 'actions' });
    if (job.status === 'queued' || job.status === 'running') {
      const b = h('button', { type: 'button', class: 'danger', 'aria-label': `Cancel job ${job.id}` }, 'Cancel');
      b.addEventListener('click', () => act(cancelJob, job, b));
      cell.append(b);
    }
    if (job.status === 'failed' || job.status === 'cancelled') {
      const b = h('button', { type: 'button', 'aria-label': `Retry job ${job.id}` }, 'Retry');
      b.addEventListener('click', () => act(retryJob, job, b));
      cell.append(b);
    }
    return cell;
  }

  function draw() {
    if (!last) return;
    // The table is rebuilt on each refresh: keep keyboard focus on the same control.
    const focused = body.contains(document.activeElement) ? document.activeElement.getAttribute('aria-label') || document.activeElement.getAttribute('href') : null;
    const rows = last.data.filter((j) => !state.text || `${j.name} ${j.model} ${j.schedule}`.toLowerCase().includes(state.text));
    clear(body);
    if (!last.count) {
      body.append(notice('empty', state.status ? `No ${state.status} jobs.` : 'No jobs yet. ', state.status ? '' : h('a', { href: '#/new' }, 'Submit the first one.')));
    } else if (!rows.length) {
      body.append(notice('empty', 'No job on this page matches the filter.'));
    } else {
      body.append(h('div', { class: 'table-wrap' }, h('table', { id: 'jobs-table' },
        h('thead', {}, h('tr', {},
          h('th', {}, 'Job'), h('th', {}, 'Status'), h('th', { class: 'num hide-narrow' }, 'Queue'),
          h('th', { class: 'hide-narrow' }, 'Model'), h('th', { class: 'hide-narrow' }, 'Submitted by'), h('th', {}, 'Schedule'), h('th', { class: 'num hide-narrow' }, 'Samples/s'),
          h('th', { class: 'num hide-narrow' }, 'Best metric'), h('th', { class: 'num hide-narrow' }, 'Duration'), h('th', {}, h('span', { class: 'hide-narrow' }, 'Actions')))),
        h('tbody', {}, rows.map((j) => h('tr', { dataset: { jobId: j.id, status: j.status } },
          h('td', { class: 'job-name' }, h('a', { href: `#/jobs/${j.id}` }, `#${j.id} ${j.name}`)),
          h('td', {}, statusBadge(j.status)),
          h('td', { class: 'num hide-narrow' }, j.queuePosition ?? '–'),
          h('td', { class: 'hide-narrow' }, j.model),
          h('td', { class: 'hide-narrow' }, j.submitted_by || '–'),
          h('td', {}, j.schedule),
          h('td', { class: 'num hide-narrow' }, fmtNumber(j.samplesPerS)),
          h('td', { class: 'num hide-narrow' }, fmtNumber(j.bestMetric)),
          h('td', { class: 'num hide-narrow' }, fmtSeconds(durationBetween(j.started_at, j.finished_at))),
          actions(j)))))));
      if (focused) body.querySelector(`[aria-label="${CSS.escape(focused)}"], [href="${CSS.escape(focused)}"]`)?.focus();
    }
    clear(pager);
    if (last.count > PAGE) {
      const prev = h('button', { type: 'button', disabled: state.offset === 0, onclick: () => { state.offset = Math.max(0, state.offset - PAGE); refresh(); } }, 'Newer');
      const next = h('button', { type: 'button', disabled: state.offset + PAGE >= last.count, onclick: () => { state.offset += PAGE; refresh(); } }, 'Older');
      pager.append(prev, h('span', { class: 'muted' }, `${state.offset + 1}–${Math.min(state.offset + PAGE, last.count)} of ${last.count}`), next);
    }
  }

  async function refresh() {
    clearTimeout(state.timer);
    state.controller?.abort();
    state.controller = new AbortController();
    try {
      last = await listJobs({ offset: state.offset, limit: PAGE, status: state.status || undefined }, state.controller.signal);
      draw();
    } catch (err) {
      if (err.name === 'AbortError') return;
      clear(body).append(notice('error', `Could not load jobs: ${err.message}`, ' ', h('button', { type: 'button', onclick: refresh }, 'Try again')));
      if (err.status === 401) return;
    }
    if (!state.closed) state.timer = setTimeout(refresh, document.hidden ? REFRESH_MS * 5 : REFRESH_MS);
  }

  refresh();
  return () => { state.closed = true; clearTimeout(state.timer); state.controller?.abort(); };
}
