// The new-job form's what-if request: POST /plans, following the worker's profiling job when the
// model has no profile yet.

import { createPlan, getJob } from './api.js';

const PROFILING_POLL_MS = 1000; // how often the what-if looks at its model's profiling job

const wait = (ms, signal) => new Promise((resolve, reject) => {
  const timer = setTimeout(resolve, ms);
  signal?.addEventListener('abort', () => { clearTimeout(timer); reject(new DOMException('aborted', 'AbortError')); });
});

/** A what-if whose model has no cached profile answers 202 with the worker's profiling job: follow
 * it (saying where it is) until it ends, then ask again; the plan comes from the profile it stored. */
export async function planFollowingProfiling(body, signal, say) {
  let answer = await createPlan(body, signal);
  while (answer.status === 'profiling') {
    let job = answer.job;
    const started = Date.now();
    while (!['succeeded', 'failed', 'cancelled'].includes(job.status)) {
      const where = job.status === 'queued' ? `queued${job.queue_position ? `, position ${job.queue_position}` : ''}` : 'running';
      say(`Profiling ${body.model} on a worker (job #${job.id}, ${where}, ${Math.round((Date.now() - started) / 1000)} s); the plan follows.`);
      await wait(PROFILING_POLL_MS, signal);
      job = await getJob(job.id, signal);
    }
    if (job.status !== 'succeeded') throw new Error(`profiling ${body.model} (job #${job.id}) ${job.status}: ${job.error || ''}`);
    answer = await createPlan(body, signal);
  }
  return answer;
}
