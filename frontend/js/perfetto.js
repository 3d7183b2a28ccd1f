// "Open in Perfetto": open ui.perfetto.dev in a new tab and hand it the trace by postMessage,
// after the PING/PONG handshake that tells us its message listener is up (the approach Ray's
// dashboard and Perfetto's own docs use: a fetch from Perfetto to us would need CORS).

export const PERFETTO_ORIGIN = 'https://ui.perfetto.dev';

/**
 * Call from a click handler (the window must open in the user gesture); `loadTrace` is an async
 * function returning an ArrayBuffer. Resolves when the trace was handed over; rejects after
 * `timeoutMs` without a PONG.
 */
export function openInPerfetto(loadTrace, title, { origin = PERFETTO_ORIGIN, timeoutMs = 30000 } = {}) {
  const win = window.open(origin);
  if (!win) return Promise.reject(new Error('the browser blocked the Perfetto window: allow pop-ups for this site'));
  const tracePromise = loadTrace();
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const ping = setInterval(() => {
      if (Date.now() - started > timeoutMs) { done(); reject(new Error('Perfetto did not answer (no PONG)')); return; }
      try { win.postMessage('PING', origin); } catch { /* not loaded yet */ }
    }, 100);
    const onMessage = async (event) => {
      if (event.source !== win || event.data !== 'PONG') return;
      done();
      try {
        const buffer = await tracePromise;
        win.postMessage({ perfetto: { buffer, title, url: location.href } }, origin);
        resolve();
      } catch (err) {
        reject(err);
      }
    };
    function done() {
      clearInterval(ping);
      window.removeEventListener('message', onMessage);
    }
    window.addEventListener('message', onMessage);
  });
}

/** Save bytes as a file through a temporary object URL. */
export function saveBytes(buffer, filename, type = 'application/json') {
  const url = URL.createObjectURL(new Blob([buffer], { type }));
  const a = document.createElement('a');
  a.href = url;
  a.download = filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
