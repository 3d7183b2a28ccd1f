// Plan view: a stored plan with its profile's layers and the simulator's predicted Gantt.

import { getPlan, getProfile } from '../api.js';
import { drawGantt } from '../gantt.js';
import { renderPlan } from '../planview.js';
import { clear, h, notice } from '../util.js';

export async function render(container, { id }) {
  const body = h('div', {}, notice('loading', 'Loading plan…'));
  container.append(h('h1', {}, `Plan ${id}`), body);
  let planPublic;
  try {
    planPublic = await getPlan(id);
  } catch (err) {
    clear(body).append(notice('error', `Could not load plan ${id}: ${err.message}`));
    return null;
  }
  // The profile adds per-layer bars; without it the plan still draws per stage.
  const profile = await getProfile(planPublic.profile_id).catch(() => null);
  const req = planPublic.request || {};
  clear(body).append(h('p', { class: 'muted' },
    `${planPublic.plan?.model || req.model || `profile ${planPublic.profile_id}`} · method ${planPublic.plan?.method ?? req.method} · `
    + `schedule ${req.schedule ?? '–'} with ${req.microbatches ?? '–'} microbatches · cluster `
    + (planPublic.plan?.cluster || []).map(([w, b]) => `${w} × ${(b / 1e9).toPrecision(3)} GB/s`).join(' / ')));
  await renderPlan(body, planPublic, profile);
  const timeline = planPublic.predicted?.timeline || [];
  if (timeline.length) {
    const div = h('div', { class: 'chart', id: 'plan-gantt' });
    body.append(h('div', { class: 'panel' }, h('h2', {}, 'Predicted timeline'), div));
    await drawGantt(div, timeline);
  }
  return null;
}
