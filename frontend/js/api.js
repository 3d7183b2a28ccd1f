// The one place that knows the REST API's routes and shapes (docs/architecture.md, /openapi.json).
// Pages call these functions and get plain objects back; adapting to a route change is done here.

export const API_BASE = '/api/v1';
const TOKEN_KEY = 'pipeboard.token';

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.body = body;
  }
}

export function getToken() {
  try { return localStorage.getItem(TOKEN_KEY) || ''; } catch { return ''; }
}

export function setToken(token) {
  if (token) localStorage.setItem(TOKEN_KEY, token);
  else localStorage.removeItem(TOKEN_KEY);
  window.dispatchEvent(new CustomEvent('pipeboard:token'));
}

export function authHeaders() {
  const token = getToken();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/** FastAPI errors: {"detail": "text"} or {"detail": [{"loc": [...], "msg": "..."}]}. */
export function errorMessage(body, status) {
  const detail = body && body.detail;
  if (typeof detail === 'string') return detail;
  if (Array.isArray(detail)) {
    return detail.map((d) => {
      const loc = (d.loc || []).filter((p) => p !== 'body' && p !== 'query').join('.');
      return loc ? `${loc}: ${d.msg}` : d.msg;
    }).join('; ');
  }
  return `HTTP ${status}`;
}

function withQuery(path, query) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== '') params.set(k, v);
  }
  const qs = params.toString();
  return qs ? `${path}?${qs}` : path;
}

export async function request(method, path, { body, form, query, signal } = {}) {
  // `form`: a FormData (multipart upload; the browser writes its Content-Type); else `body` as JSON
  const headers = { Accept: 'application/json', ...authHeaders() };
  if (body !== undefined && form === undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(API_BASE + withQuery(path, query), {
      method, headers, signal, body: form ?? (body === undefined ? undefined : JSON.stringify(body)),
    });
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new ApiError(0, `cannot reach the server (${err.message})`, null);
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (response.status === 401) {
    // The page asks for a token and comes back here after sign-in.
    window.dispatchEvent(new CustomEvent('pipeboard:unauthorized', { detail: { path } }));
  }
  if (!response.ok) throw new ApiError(response.status, errorMessage(data, response.status), data);
  return data;
}

const list = (data) => (Array.isArray(data) ? { data, count: data.length } : { data: data?.data ?? [], count: data?.count ?? 0 });

// ---- jobs ---------------------------------------------------------------------------------

/** The best validation metric of a run: highest, or lowest for perplexity and losses. */
export function bestMetric(summary) {
  // The runtime knows the metric's direction (the zoo's higher_is_better) and reports the best.
  if (summary.best_metric != null) return summary.best_metric;
  const values = (summary.evaluations || []).map((e) => e.metric).filter((v) => Number.isFinite(v));
  if (!values.length) return summary.final_metric ?? null;
  // Summaries stored before the runtime reported it: the direction from the metric's name.
  const lowerIsBetter = /perplexity|loss|error/i.test(summary.metric_name || '');
  return lowerIsBetter ? Math.min(...values) : Math.max(...values);
}

/** A job in the shape the pages use, whatever optional fields the service fills. */
export function normalizeJob(job) {
  const spec = job.spec || {};
  const summary = job.summary || {};
  return {
    ...job,
    spec,
    summary,
    name: job.name || spec.name || `job ${job.id}`,
    model: spec.model?.name ?? '', // the job specification, version 2 (app/schemas/jobspec.py)
    schedule: spec.layout?.schedule ?? '',
    queuePosition: job.queue_position ?? null,
    samplesPerS: summary.samples_per_s ?? job.samples_per_s ?? null,
    bestMetric: bestMetric(summary),
    metricName: summary.metric_name ?? null,
  };
}

export async function listJobs({ offset = 0, limit = 50, status } = {}, signal) {
  const page = list(await request('GET', '/jobs', { query: { offset, limit, status }, signal }));
  return { data: page.data.map(normalizeJob), count: page.count };
}

export const getJob = async (id, signal) => normalizeJob(await request('GET', `/jobs/${id}`, { signal }));
export const createJob = async (spec) => normalizeJob(await request('POST', '/jobs', { body: spec }));
export const cancelJob = (id) => request('POST', `/jobs/${id}/cancel`);
export const retryJob = (id) => request('POST', `/jobs/${id}/retry`);

/** Timeline events (measured or predicted) as {worker, stage, replica, microbatch, kind, start, end, step}. */
export async function getTimeline(id, { source = 'measured', ...query } = {}, signal) {
  const data = await request('GET', `/jobs/${id}/timeline`, { query: { source, ...query }, signal });
  if (Array.isArray(data)) return data;
  return data?.data ?? data?.events ?? [];
}

/** Metric points as {step, wall_s, epoch, values: {...}}. */
export async function getMetrics(id, signal) {
  const data = await request('GET', `/jobs/${id}/metrics`, { signal });
  const rows = Array.isArray(data) ? data : data?.points ?? data?.data ?? [];
  return rows.map(normalizeMetric);
}

export function normalizeMetric(m) {
  if (m.values) return m;
  const { step, wall_s: wall, epoch, ...rest } = m;
  return { step, wall_s: wall, epoch, values: rest };
}

export const traceUrl = (id) => `${API_BASE}/jobs/${id}/trace`;
export const eventsUrl = (id) => `${API_BASE}/jobs/${id}/events`;

/** The Chrome trace as bytes (fetched with the token, for download and for Perfetto). */
export async function fetchTrace(id) {
  const response = await fetch(traceUrl(id), { headers: authHeaders() });
  if (!response.ok) {
    let body = null;
    try { body = await response.json(); } catch { /* not JSON */ }
    throw new ApiError(response.status, errorMessage(body, response.status), body);
  }
  return response.arrayBuffer();
}

// ---- models, profiles, plans --------------------------------------------------------------

export async function listModels(signal) {
  return list(await request('GET', '/models', { query: { limit: 200 }, signal })).data;
}

/** The registered schedules and what each can do (chunks, vertical sync, weight-gradient modes). */
export async function listSchedules(signal) {
  return list(await request('GET', '/schedules', { query: { limit: 1000 }, signal })).data;
}

export const getProfile = (id, signal) => request('GET', `/profiles/${id}`, { signal });
export const getPlan = (id, signal) => request('GET', `/plans/${id}`, { signal });

/** The what-if: plan (and simulate) without running anything. */
export const createPlan = (body, signal) => request('POST', '/plans', { body, signal });

// ---- auth ---------------------------------------------------------------------------------

/** Who the stored token belongs to (404/405 when the service has no such route: treat as fine). */
export async function whoAmI() {
  return request('GET', '/tokens/me');
}

export const health = () => request('GET', '/health');

// ---- code contexts and models ------------------------------------------------------------------

/** Upload a project archive (.zip or .tar.gz): the stored context ({sha256, files, ...}). */
export async function uploadContext(file, signal) {
  const form = new FormData();
  form.append('file', file, file.name);
  return request('POST', '/contexts', { form, signal });
}

/** One model (zoo or registered) by name: its `status` says whether a worker has validated it. */
export async function getModel(name, signal) {
  return request('GET', `/models/${encodeURIComponent(name)}`, { signal });
}
