// Small DOM and formatting helpers shared by the pages (no framework: the pages are few).

/** Create an element: h('button', {class: 'x', onclick: f}, 'text', child, ...). */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') node.addEventListener(key.slice(2), value);
    else if (key === 'class') node.className = value;
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key in node && typeof value !== 'string') node[key] = value;
    else node.setAttribute(key, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** Go to a page of the hash router (`navigate('/jobs/3')`). */
export function navigate(path) {
  location.hash = `#${path}`;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

/** Call `fn` once calls have stopped for `ms` (what-if requests while the user types). */
export function debounce(fn, ms) {
  let timer = null;
  const wrapped = (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
  wrapped.cancel = () => clearTimeout(timer);
  return wrapped;
}

export function fmtNumber(value, digits = 3) {
  if (value === undefined || value === null || Number.isNaN(value)) return '–';
  const n = Number(value);
  if (!Number.isFinite(n)) return String(value);
  if (Math.abs(n) >= 1000) return n.toLocaleString('en-US', { maximumFractionDigits: 0 });
  return Number(n.toPrecision(digits)).toString();
}

export function fmtSeconds(seconds) {
  if (seconds === undefined || seconds === null || !Number.isFinite(seconds)) return '–';
  if (seconds < 1e-3) return `${(seconds * 1e6).toFixed(0)} µs`;
  if (seconds < 1) return `${(seconds * 1e3).toFixed(1)} ms`;
  if (seconds < 120) return `${seconds.toFixed(1)} s`;
  const m = Math.floor(seconds / 60);
  if (m < 120) return `${m} min ${Math.round(seconds - 60 * m)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

export function fmtBytes(bytes) {
  if (bytes === undefined || bytes === null || !Number.isFinite(bytes)) return '–';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  let v = bytes;
  while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

export function fmtPercent(fraction) {
  if (fraction === undefined || fraction === null || !Number.isFinite(fraction)) return '–';
  return `${(fraction * 100).toFixed(1)}%`;
}

/** Seconds between two ISO timestamps (or until now when `end` is empty). */
export function durationBetween(start, end) {
  if (!start) return null;
  const a = Date.parse(start);
  const b = end ? Date.parse(end) : Date.now();
  return Number.isFinite(a) && Number.isFinite(b) ? Math.max(0, (b - a) / 1000) : null;
}

export function statusBadge(status) {
  return h('span', { class: `badge status-${status || 'unknown'}` }, status || 'unknown');
}

/** A message box for empty, loading and error states. */
export function notice(kind, text, ...extra) {
  return h('div', { class: `notice notice-${kind}`, role: kind === 'error' ? 'alert' : 'status' }, text, ...extra);
}

/** Parse "a=1, b=x" or a JSON object into an object (model args typed in the form). */
export function parseArgs(text) {
  const trimmed = (text || '').trim();
  if (!trimmed) return {};
  if (trimmed.startsWith('{')) return JSON.parse(trimmed);
  const out = {};
  for (const part of trimmed.split(',')) {
    const [key, ...rest] = part.split('=');
    if (!key.trim() || rest.length === 0) throw new Error(`model args: "${part.trim()}" is not key=value`);
    const raw = rest.join('=').trim();
    const num = Number(raw);
    out[key.trim()] = raw === 'true' ? true : raw === 'false' ? false : raw !== '' && Number.isFinite(num) ? num : raw;
  }
  return out;
}

let plotlyLoading = null;

/** Load plotly.js once (its path is in <meta name="plotly-src">); resolves with window.Plotly. */
export function ensurePlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!plotlyLoading) {
    plotlyLoading = new Promise((resolve, reject) => {
      const src = document.querySelector('meta[name="plotly-src"]')?.content;
      if (!src) { reject(new Error('no plotly-src meta tag')); return; }
      const script = document.createElement('script');
      script.src = src;
      script.onload = () => (window.Plotly ? resolve(window.Plotly) : reject(new Error('plotly.js loaded but defined nothing')));
      script.onerror = () => { plotlyLoading = null; reject(new Error(`could not load ${src}`)); };
      document.head.append(script);
    });
  }
  return plotlyLoading;
}

/** Plotly layout defaults shared by every chart (readable on a narrow window too). */
export function baseLayout(extra = {}) {
  return {
    margin: { l: 60, r: 16, t: 32, b: 40 },
    font: { family: 'system-ui, sans-serif', size: 12, color: '#1f2933' },
    paper_bgcolor: 'rgba(0,0,0,0)',
    plot_bgcolor: '#fff',
    legend: { orientation: 'h', y: -0.2 },
    ...extra,
  };
}

export const PLOT_CONFIG = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ['lasso2d', 'select2d'] };

export const STAGE_COLORS = ['#4C78A8', '#F58518', '#54A24B', '#E45756', '#72B7B2', '#B279A2', '#FF9DA6', '#9D755D', '#BAB0AC', '#EECA3B'];
export const stageColor = (stage) => STAGE_COLORS[((stage % STAGE_COLORS.length) + STAGE_COLORS.length) % STAGE_COLORS.length];
