// Workers: each live Celery worker with its GPUs (as its torch reports them), each free or held by
// a job, refreshed every few seconds. A cuda job runs only where enough GPUs are free; the job's
// page says why one waits.

import { request } from '../api.js';
import { clear, fmtBytes, h, notice } from '../util.js';

const REFRESH_MS = 3000;

function deviceRow(d) {
  const held = d.job_id == null
    ? h('span', { class: 'badge status-succeeded' }, 'free')
    : h('a', { href: `#/jobs/${d.job_id}`, class: 'badge status-running' }, `job ${d.job_id}`);
  return h('tr', {},
    h('td', {}, `cuda:${d.index}`), h('td', {}, d.name), h('td', {}, fmtBytes(d.memory_bytes)),
    h('td', {}, d.capability), h('td', {}, `${d.cuda ?? '?'} / ${d.driver ?? '?'}`), h('td', {}, held));
}

function workerPanel(w) {
  const busy = w.devices.filter((d) => d.job_id != null).length;
  const summary = !w.devices_reported ? 'GPUs: not reported yet'
    : w.devices.length ? `${w.devices.length} GPU(s), ${w.devices.length - busy} free` : 'no GPU (CPU jobs only)';
  const panel = h('section', { class: 'panel worker', 'data-worker': w.worker },
    h('h2', {}, w.worker),
    h('p', { class: 'muted' }, `host ${w.host} · ${w.pool} pool, ${w.concurrency} at once · last seen `,
      h('time', { datetime: w.seen_at }, new Date(w.seen_at).toLocaleTimeString()), ` · ${summary}`));
  if (w.devices.length) {
    panel.append(h('table', { class: 'table' },
      h('thead', {}, h('tr', {}, ['GPU', 'Name', 'Memory', 'Capability', 'CUDA / driver', 'Held by'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, w.devices.map(deviceRow))));
  }
  return panel;
}

export function render(container) {
  const body = h('div', { id: 'workers-body' }, notice('loading', 'Loading workers…'));
  container.append(h('h1', {}, 'Workers'), body);
  let timer = null;
  let closed = false;
  const controller = new AbortController();

  async function refresh() {
    try {
      const page = await request('GET', '/workers', { query: { limit: 100 }, signal: controller.signal });
      if (closed) return;
      clear(body);
      if (!page.data.length) body.append(notice('empty', 'No live worker. Start one with `pipeboard worker` (or `pipeboard up`).'));
      else body.append(...page.data.map(workerPanel));
    } catch (err) {
      if (closed) return;
      clear(body).append(notice('error', `Could not list workers: ${err.message}`));
    }
    if (!closed) timer = setTimeout(refresh, REFRESH_MS);
  }
  refresh();
  return () => { closed = true; controller.abort(); clearTimeout(timer); };
}
