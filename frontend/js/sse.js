// Live updates from the job event stream (Server-Sent Events), delivered in batches.
//
// The stream needs a token, like every read. EventSource cannot send an Authorization header (and
// a long-lived token must not go into a URL, where logs keep it), so with a token the protocol runs
// over fetch, sending the header and Last-Event-ID itself and reconnecting as EventSource would.
// Only a server with PIPEBOARD_AUTH=off (loopback) is read without one, by EventSource. Either way the page gets `onBatch(messages)` at most once per
// animation frame (or every `maxDelayMs` when the tab is hidden): never one redraw per event.

import { authHeaders, getToken } from './api.js';

// Event names the service may send; unnamed events arrive as "message".
export const EVENT_TYPES = ['message', 'status', 'progress', 'timeline', 'events', 'metrics', 'summary', 'attempt', 'fidelity', 'error', 'end', 'done', 'heartbeat'];

function parseData(text) {
  try { return JSON.parse(text); } catch { return text; }
}

/**
 * Open a stream. Returns {close(), lastEventId()}.
 * options: onBatch(messages), isTerminal(message) -> bool, onState(state: 'open'|'reconnecting'|'closed'),
 * maxDelayMs (hidden-tab flush interval), lastEventId (resume point).
 */
export function openStream(url, options = {}) {
  const { onBatch, isTerminal = () => false, onState = () => {}, maxDelayMs = 250 } = options;
  let pending = [];
  let frame = null;
  let timer = null;
  let closed = false;
  let lastId = options.lastEventId ?? null;
  let transport = null;

  const flush = () => {
    if (frame !== null) cancelAnimationFrame(frame);
    clearTimeout(timer);
    frame = null;
    timer = null;
    if (!pending.length) return;
    const batch = pending;
    pending = [];
    onBatch(batch);
  };

  const schedule = () => {
    if (frame === null) frame = requestAnimationFrame(flush);
    if (timer === null) timer = setTimeout(flush, maxDelayMs);
  };

  const deliver = (type, data, id) => {
    if (closed) return;
    if (id !== undefined && id !== null && id !== '') lastId = id;
    const message = { type, data: parseData(data), id: lastId };
    pending.push(message);
    if (isTerminal(message)) {
      flush();
      api.close();
      return;
    }
    schedule();
  };

  const api = {
    close() {
      if (closed) return;
      closed = true;
      flush();
      transport?.close();
      onState('closed');
    },
    lastEventId: () => lastId,
  };

  transport = getToken() ? fetchTransport(url, deliver, () => lastId, onState, () => closed)
    : eventSourceTransport(url, deliver, onState, lastId);
  return api;
}

function eventSourceTransport(url, deliver, onState, resumeId) {
  // A first connection that must resume passes the id as a query parameter (EventSource sets the
  // Last-Event-ID header only on its own reconnections).
  const full = resumeId ? `${url}${url.includes('?') ? '&' : '?'}last_event_id=${encodeURIComponent(resumeId)}` : url;
  const source = new EventSource(full);
  source.onopen = () => onState('open');
  source.onerror = () => onState(source.readyState === EventSource.CLOSED ? 'closed' : 'reconnecting');
  for (const type of EVENT_TYPES) {
    source.addEventListener(type, (event) => deliver(type, event.data, event.lastEventId));
  }
  return { close: () => source.close() };
}

function fetchTransport(url, deliver, lastId, onState, isClosed) {
  const controller = new AbortController();
  let retryMs = 1000;

  const connect = async () => {
    while (!isClosed()) {
      try {
        const headers = { Accept: 'text/event-stream', ...authHeaders() };
        if (lastId()) headers['Last-Event-ID'] = lastId();
        const response = await fetch(url, { headers, signal: controller.signal, cache: 'no-store' });
        if (response.status === 401) {
          window.dispatchEvent(new CustomEvent('pipeboard:unauthorized', { detail: { path: url } }));
          onState('closed');
          return;
        }
        if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
        onState('open');
        await readEvents(response.body, deliver, (ms) => { retryMs = ms; });
      } catch (err) {
        if (err.name === 'AbortError' || isClosed()) return;
      }
      if (isClosed()) return;
      onState('reconnecting');
      await new Promise((resolve) => setTimeout(resolve, retryMs));
    }
  };
  connect();
  return { close: () => controller.abort() };
}

/** The text/event-stream framing: fields per line, an empty line ends an event. */
async function readEvents(body, deliver, setRetry) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let type = 'message';
  let data = [];
  let id;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let newline;
    while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, newline);
      buffer = buffer.slice(newline + (buffer.startsWith('\r\n', newline) ? 2 : 1));
      if (line === '') {
        if (data.length) deliver(type, data.join('\n'), id);
        type = 'message';
        data = [];
        id = undefined;
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let val = colon < 0 ? '' : line.slice(colon + 1);
      if (val.startsWith(' ')) val = val.slice(1);
      if (field === 'event') type = val;
      else if (field === 'data') data.push(val);
      else if (field === 'id') id = val;
      else if (field === 'retry' && /^\d+$/.test(val)) setRetry(Number(val));
    }
  }
}
