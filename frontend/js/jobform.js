// The new-job form's controls: labelled fields, the error's field marked, the model's label.

import { h } from './util.js';

const WEIGHT_GRADS_HINTS = { batched: 'one weight pass per update', immediate: 'in every backward' };

// The job specification's field (as error messages name it, e.g. "layout.microbatches") -> the
// form control to mark and focus; a section alone names the controls that fill it.
const FIELD_IDS = {
  name: 'f-name', 'model.name': 'f-model', 'model.loader_workers': 'f-loader-workers', 'model.args': 'f-model-args', 'model.data': 'f-data', 'model.batch_size': 'f-batch',
  'layout.workers': 'f-workers', 'layout.levels': 'f-levels', 'layout.memory_bytes': 'f-memory', 'layout.method': 'f-method',
  'layout.schedule': 'f-schedule', 'layout.weight_grads': 'f-weight-grads', 'layout.microbatches': 'f-microbatches',
  'layout.chunks': 'f-chunks', 'layout.recompute': 'f-recompute', 'layout.vertical_sync': 'f-vertical-sync', layout: 'f-workers', length: 'f-stop-value',
  'length.eval_every': 'f-hyper', optimizer: 'f-hyper', 'hyper-parameters': 'f-hyper', 'machine.device': 'f-device',
  'machine.precision': 'f-precision', priority: 'f-priority', source: 'f-import-path', context: 'f-import-archive',
};

/** Mark the control named at the start of `message` ("layout.microbatches: ...") invalid and focus it. */
export function markField(form, message) {
  form.querySelectorAll('[aria-invalid]').forEach((el) => el.removeAttribute('aria-invalid'));
  const named = /^([A-Za-z_.\-]+):/.exec(message || '')?.[1] || '';
  const parts = named.split('.');
  const id = FIELD_IDS[parts.slice(0, 2).join('.')] || FIELD_IDS[parts[0]];
  const el = id && document.getElementById(id);
  if (!el) return;
  el.setAttribute('aria-invalid', 'true');
  el.setAttribute('aria-describedby', 'form-error');
  el.focus();
}

export function field(id, label, input, hint) {
  input.id = id;
  return h('div', {}, h('label', { for: id }, label, hint ? h('span', { class: 'hint' }, ` ${hint}`) : null), input);
}

/** "a", "a and b", "a, b and c": the names of the schedules a sentence is about, as the API's descriptions write them. */
export const listed = (names) => (names.length < 2 ? names.join('') : `${names.slice(0, -1).join(', ')} and ${names[names.length - 1]}`);

/** The select with a hint under it saying what the chosen value does (the schedules that ignore it: see the title). */
export function weightGradsField(select) {
  const hint = h('div', { class: 'hint', id: 'f-weight-grads-hint' });
  const say = () => { hint.textContent = WEIGHT_GRADS_HINTS[select.value] || ''; };
  select.addEventListener('change', say);
  say();
  return h('div', {}, h('label', { for: 'f-weight-grads' }, 'Weight gradients'), select, hint);
}

export const num = (attrs) => h('input', { type: 'number', ...attrs });

/** "name", or "name (context)", "name (import, failed)": what kind of model, and if not ready, why not. */
export const modelLabel = (m) => (m.kind === 'zoo' ? m.name : `${m.name} (${m.kind}${m.status && m.status !== 'ready' ? `, ${m.status}` : ''})`);
