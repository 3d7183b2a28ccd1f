// Entry point: a hash router over the pages. Each page module exports
// `render(container, params) -> cleanup` so leaving a page closes its streams and timers.

import { getToken, setToken, whoAmI } from './api.js';
import { clear, ensurePlotly, h, navigate, notice } from './util.js';

const ROUTES = [
  { pattern: /^\/?$/, redirect: '/jobs' },
  { pattern: /^\/jobs$/, page: 'jobs', nav: 'jobs', title: 'Jobs' },
  { pattern: /^\/new$/, page: 'newjob', nav: 'new', title: 'New job', charts: true },
  { pattern: /^\/jobs\/(\d+)$/, page: 'job', nav: 'jobs', title: 'Job', charts: true, keys: ['id'] },
  { pattern: /^\/plans\/(\d+)$/, page: 'plan', nav: 'new', title: 'Plan', charts: true, keys: ['id'] },
  { pattern: /^\/compare$/, page: 'compare', nav: 'compare', title: 'Compare', charts: true },
  { pattern: /^\/workers$/, page: 'workers', nav: 'workers', title: 'Workers' },
  { pattern: /^\/signin$/, page: 'signin', nav: '', title: 'Sign in' },
];

const view = document.getElementById('view');
let cleanup = null;
let generation = 0;

/** A sign-in link, `http://host:port/#token=pb_...` (a first `pipeboard up` prints one): keep the
 * token as the current sign-in, as the sign-in page does, and take it out of the address bar and
 * the history. A fragment never reaches the server, so no log holds it. */
function adoptTokenFromUrl() {
  const match = location.hash.match(/^#token=([^&]+)$/);
  if (!match) return;
  setToken(decodeURIComponent(match[1]));
  history.replaceState(null, '', `${location.pathname}${location.search}#/jobs`);
}

function parseHash() {
  const raw = decodeURIComponent(location.hash.replace(/^#/, '')) || '/';
  const [path, search = ''] = raw.split('?');
  return { path, query: Object.fromEntries(new URLSearchParams(search)) };
}

let openReads = null;
/** Whether this server lets reads through without a token (PIPEBOARD_AUTH=off, on loopback only):
 * asked once, with a token-less `/tokens/me`, which answers 401 everywhere else. */
function readsAreOpen() {
  openReads ??= fetch('/api/v1/tokens/me', { headers: { Accept: 'application/json' } })
    .then((r) => r.ok).catch(() => false);
  return openReads;
}

async function route() {
  const { path, query } = parseHash();
  const match = ROUTES.map((r) => ({ r, m: path.match(r.pattern) })).find((x) => x.m);
  if (match?.r.redirect) { navigate(match.r.redirect); return; }
  // Every read needs a token: a signed-out visitor is asked to sign in instead of seeing a page
  // of 401s, and comes back to the page asked for.
  if (match && match.r.page !== 'signin' && !getToken() && !(await readsAreOpen())) {
    navigate(`/signin?next=${encodeURIComponent(path)}`);
    return;
  }
  if (typeof cleanup === 'function') { try { cleanup(); } catch (err) { console.warn(err); } }
  cleanup = null;
  const mine = ++generation;
  clear(view);
  document.querySelectorAll('[data-nav]').forEach((a) => {
    if (match && a.dataset.nav === match.r.nav) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  });
  if (!match) {
    view.append(h('h1', {}, 'Not found'), notice('empty', `No page at ${path}. `, h('a', { href: '#/jobs' }, 'Back to jobs')));
    return;
  }
  const params = { ...query };
  (match.r.keys || []).forEach((k, i) => { params[k] = match.m[i + 1]; });
  document.title = `${match.r.title}${params.id ? ` ${params.id}` : ''} · pipeboard`;
  try {
    const [module] = await Promise.all([import(`./pages/${match.r.page}.js`), match.r.charts ? ensurePlotly() : null]);
    if (mine !== generation) return; // the user moved on while the module loaded
    cleanup = await module.render(view, params);
    if (mine !== generation && typeof cleanup === 'function') cleanup();
  } catch (err) {
    if (mine !== generation) return;
    console.warn(err);
    view.append(notice('error', `This page failed to load: ${err.message}`));
  }
}

let authGeneration = 0;
async function renderAuth() {
  const mine = ++authGeneration; // a sign-in event and the start both call this: the last one draws
  const box = clear(document.getElementById('auth-status'));
  if (!getToken()) {
    box.append(h('a', { href: '#/signin' }, 'Sign in'));
    return;
  }
  let label = 'token set';
  try {
    const me = await whoAmI();
    if (me?.authenticated) label = `${me.user ?? me.name}: token ${me.name} (${me.scope})`;
  } catch { /* an invalid token sends the user to the sign-in page */ }
  if (mine !== authGeneration) return;
  clear(box).append(h('span', {}, label),
    h('button', { type: 'button', onclick: () => { setToken(''); navigate('/signin'); } }, 'Sign out'));
}

window.addEventListener('pipeboard:unauthorized', () => {
  const { path } = parseHash();
  if (path !== '/signin') navigate(`/signin?next=${encodeURIComponent(path)}`);
});
window.addEventListener('pipeboard:token', renderAuth);
// A sign-in link opened while the dashboard is already open (another user's, say) signs in too.
window.addEventListener('hashchange', () => { adoptTokenFromUrl(); route(); view.focus({ preventScroll: true }); });

adoptTokenFromUrl();
renderAuth();
route();
