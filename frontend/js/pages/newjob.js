// New job: the form, and beside it the plan it would run (POST /plans, the what-if), redrawn
// as the inputs change (debounced, the previous request aborted). The schedules come from the
// service's registry (GET /schedules): the select lists them, and the chunks and vertical-sync
// fields show for the schedules that take them.

import { ApiError, createJob, getModel, listModels, listSchedules, request, uploadContext } from '../api.js';
import { drawGantt } from '../gantt.js';
import { field, listed, markField, modelLabel, num, weightGradsField } from '../jobform.js';
import { renderWhatIf } from '../planview.js';
import { chooseForMe, fillForm, tuneBody } from '../tune.js';
import { clear, debounce, h, navigate, notice, parseArgs } from '../util.js';
import { planFollowingProfiling } from '../whatif.js';

const METHODS = ['pipedream', 'uniform', 'time', 'params', 'dp'];
const WEIGHT_GRADS = ['batched', 'immediate']; // `pipeboard train --weight-grads`, the first is its default
const WEIGHT_GRADS_TITLE = 'batched: each backward computes input gradients only, and one pass right before the weight '
  + 'update computes the weight gradients of all its microbatches (faster on small microbatches); immediate: each '
  + 'backward computes both. Same gradients.';
// layout.recompute: the form offers the two words; stage numbers ([0, 2]) go through the API or a job YAML
const RECOMPUTE = ['none', 'all'];
const RECOMPUTE_TITLE = 'Activation recompute: all stages keep only their inputs per microbatch and rerun their forward '
  + 'in each backward (less memory, more time; the same gradients).';
const STOPS = [['steps', 'steps'], ['epochs', 'epochs'], ['target', 'target metric'], ['time_s', 'time (s)']];
const DEVICES = ['cpu', 'cuda']; // machine.device: cuda is refused while no worker reports a GPU
const PRECISIONS = ['fp32', 'bf16']; // machine.precision
// the hyper-parameters field's keys -> [section, field] of the job specification
const HYPER_FIELDS = { lr: ['optimizer', 'lr'], seed: ['optimizer', 'seed'], optimizer: ['optimizer', 'name'], eval_every: ['length', 'eval_every'] };
const LOCAL_BANDWIDTH = 5e9; // what the service assumes between local worker processes
export async function render(container) {
  const els = {
    name: h('input', { type: 'text', placeholder: 'optional', autocomplete: 'off' }),
    model: h('select', {}, h('option', { value: '' }, 'loading models…')),
    importName: h('input', { type: 'text', placeholder: 'my-model' }),
    importPath: h('input', { type: 'text', placeholder: 'task.py:make_task or package.module:factory' }),
    importArchive: h('input', { type: 'file', accept: '.zip,.tar.gz,.tgz,application/zip,application/gzip' }),
    modelArgs: h('input', { type: 'text', placeholder: 'e.g. hidden=64, layers=4' }),
    data: h('input', { type: 'text', placeholder: 'the zoo model’s own' }),
    loaderWorkers: num({ min: 0, max: 64, placeholder: 'the task’s' }),
    clusterMode: h('select', {}, h('option', { value: 'local' }, 'local worker processes'), h('option', { value: 'levels' }, 'cluster levels (what-if)')),
    workers: num({ min: 1, max: 64, value: 2 }),
    levels: h('textarea', { rows: 3, placeholder: 'workers bandwidth-GB/s per line, innermost first\n4 10\n2 1.25' }),
    memory: num({ min: 0, step: 'any', placeholder: 'no limit' }),
    method: h('select', {}, METHODS.map((m) => h('option', { value: m }, m))),
    schedule: h('select', {}, h('option', { value: '' }, 'loading schedules…')),
    chunks: num({ min: 1, max: 16, value: 2 }),
    verticalSync: h('input', { type: 'checkbox', style: 'width:auto', title: 'Every stage runs a microbatch with the weight version the first stage used for it' }),
    weightGrads: h('select', { id: 'f-weight-grads', 'aria-describedby': 'f-weight-grads-hint', title: WEIGHT_GRADS_TITLE },
      WEIGHT_GRADS.map((v) => h('option', { value: v }, v))),
    recompute: h('select', { title: RECOMPUTE_TITLE }, RECOMPUTE.map((v) => h('option', { value: v }, v))),
    microbatches: num({ min: 1, max: 1024, value: 4 }),
    batchSize: num({ min: 1, max: 65536, value: 32 }),
    stopKind: h('select', {}, STOPS.map(([v, t]) => h('option', { value: v }, t))),
    stopValue: num({ min: 0, step: 'any', value: 20 }),
    hyper: h('input', { type: 'text', placeholder: 'e.g. lr=0.05, seed=1, optimizer=sgd' }),
    device: h('select', { title: 'cuda is refused while no worker reports a GPU' }, DEVICES.map((v) => h('option', { value: v }, v))),
    precision: h('select', { title: 'bf16: forwards under autocast, float32 master weights' },
      PRECISIONS.map((v) => h('option', { value: v }, v))),
    priority: num({ min: -100, max: 100, value: 0 }),
  };
  els.levels.value = '4 10\n2 1.25';

  const importStatus = h('div', { class: 'hint', role: 'status', id: 'register-status' });
  const importBox = h('div', { class: 'fields', hidden: true },
    field('f-import-name', 'Name', els.importName),
    field('f-import-archive', 'Project archive', els.importArchive, '.zip or .tar.gz (optional: else installed on the workers)'),
    field('f-import-path', 'Task factory', els.importPath, 'returns a trainer.Task'),
    h('div', { style: 'align-self:end' }, h('button', { type: 'button', id: 'register-model', onclick: registerModel }, 'Register model')));
  const workersBox = field('f-workers', 'Workers', els.workers);
  const levelsBox = field('f-levels', 'Levels', els.levels);
  levelsBox.hidden = true;
  // shown for the schedules that take them (their capabilities, from GET /schedules)
  const chunksBox = field('f-chunks', 'Chunks / worker', els.chunks);
  chunksBox.hidden = true;
  const verticalSyncBox = field('f-vertical-sync', 'Vertical sync', els.verticalSync);
  verticalSyncBox.hidden = true;
  const formError = h('div', { class: 'field-error', role: 'alert', id: 'form-error' });
  const submit = h('button', { type: 'submit', class: 'primary', id: 'submit-job' }, 'Submit job');
  // the tuner (POST /tune, frontend/js/tune.js): its ranked table under the form; a row fills the form
  const tuneButton = h('button', { type: 'button', id: 'choose-for-me',
    title: 'Search splits, schedules, microbatch counts and recompute for these workers, batch and memory' }, 'Choose for me');
  const tuneBox = h('div', { id: 'tune-body' });

  const form = h('form', { id: 'new-job-form', novalidate: true },
    h('fieldset', {}, h('legend', {}, 'Model'),
      h('div', { class: 'fields' },
        field('f-model', 'Model', els.model),
        field('f-model-args', 'Model args', els.modelArgs),
        field('f-data', 'Data', els.data),
        field('f-loader-workers', 'Loader workers', els.loaderWorkers, 'per loading stage'),
        field('f-name', 'Job name', els.name)),
      importBox, importStatus),
    h('fieldset', {}, h('legend', {}, 'Cluster and plan'),
      h('div', { class: 'fields' },
        field('f-cluster-mode', 'Workers from', els.clusterMode),
        workersBox, levelsBox,
        field('f-memory', 'Memory / worker (GB)', els.memory),
        field('f-method', 'Planner', els.method),
        field('f-schedule', 'Schedule', els.schedule),
        chunksBox, verticalSyncBox,
        weightGradsField(els.weightGrads),
        field('f-recompute', 'Activation recompute', els.recompute),
        field('f-microbatches', 'Microbatches', els.microbatches),
        field('f-batch', 'Batch size', els.batchSize))),
    h('fieldset', {}, h('legend', {}, 'Training'),
      h('div', { class: 'fields' },
        field('f-stop-kind', 'Stop after', els.stopKind),
        field('f-stop-value', 'Stop value', els.stopValue),
        field('f-hyper', 'Hyper-parameters', els.hyper),
        field('f-priority', 'Priority', els.priority))),
    h('fieldset', {}, h('legend', {}, 'Machine'),
      h('div', { class: 'fields' },
        field('f-device', 'Device', els.device),
        field('f-precision', 'Precision', els.precision))),
    h('div', { class: 'toolbar' }, submit, tuneButton, formError));

  const whatIf = h('section', { class: 'panel', id: 'what-if', 'aria-labelledby': 'what-if-title' },
    h('h2', { id: 'what-if-title', style: 'margin-top:0' }, 'The plan it would run'),
    h('div', { id: 'what-if-body' }, notice('empty', 'The plan appears here as you fill in the form.')));
  const tunePanel = h('section', { class: 'panel', id: 'tune-panel', hidden: true, 'aria-labelledby': 'tune-title' },
    h('h2', { id: 'tune-title', style: 'margin-top:0' }, 'Choose for me: the candidates, best first'), tuneBox);
  container.append(h('h1', {}, 'New job'), h('div', { class: 'row' }, h('div', { class: 'panel' }, form), whatIf), tunePanel);

  let controller = null;
  let closed = false;

  function levelsFromText() {
    return els.levels.value.split('\n').map((l) => l.trim()).filter(Boolean).map((line, i) => {
      const [w, bw] = line.split(/[\s,]+/).map(Number);
      if (!Number.isInteger(w) || w < 1 || !(bw > 0)) throw new Error(`layout.levels: line ${i + 1} "${line}" is not "workers bandwidth-GB/s"`);
      return { workers: w, bandwidth: bw * 1e9 };
    });
  }

  let schedules = [];
  const chosenSchedule = () => schedules.find((s) => s.name === els.schedule.value);

  /** Show the fields the chosen schedule takes; a chunks field that appears starts at its default. */
  function showScheduleFields() {
    const s = chosenSchedule();
    if (chunksBox.hidden && s?.chunks) els.chunks.value = s.default_chunks;
    chunksBox.hidden = !s?.chunks;
    verticalSyncBox.hidden = !s?.vertical_sync;
    els.schedule.title = s?.description || '';
  }

  /** The hyper-parameters field's keys, each put in its section of `out` (optimizer, length). */
  function putHyperparameters(out) {
    let given;
    try { given = parseArgs(els.hyper.value); } catch (e) { throw new Error(e.message.replace('model args', 'hyper-parameters')); }
    for (const [key, value] of Object.entries(given)) {
      const where = HYPER_FIELDS[key];
      if (!where) throw new Error(`hyper-parameters: ${key} is not one (${Object.keys(HYPER_FIELDS).join(', ')})`);
      out[where[0]][where[1]] = value;
    }
  }

  /** The job specification (version 2, app/schemas/jobspec.py) from the form; throws Error naming the field on bad input. */
  function spec() {
    const model = els.model.value;
    if (!model || model === '__import__') throw new Error('model.name: pick a model (register your task first)');
    if (!chosenSchedule()) throw new Error('layout.schedule: no schedule chosen (the list could not be loaded)');
    const out = {
      version: 2,
      priority: Number(els.priority.value || 0),
      model: { name: model, args: parseArgs(els.modelArgs.value), batch_size: Number(els.batchSize.value) },
      layout: {
        method: els.method.value,
        schedule: els.schedule.value,
        weight_grads: els.weightGrads.value,
        // a list of stages (a tuner's choice) is kept as its JSON text in the select
        recompute: els.recompute.value.startsWith('[') ? JSON.parse(els.recompute.value) : els.recompute.value,
        microbatches: Number(els.microbatches.value),
      },
      length: { [els.stopKind.value]: Number(els.stopValue.value) },
      optimizer: {},
      machine: { device: els.device.value, precision: els.precision.value },
    };
    putHyperparameters(out);
    // the chunks and vertical sync the chosen schedule takes
    if (!chunksBox.hidden) out.layout.chunks = Number(els.chunks.value);
    if (!verticalSyncBox.hidden && els.verticalSync.checked) out.layout.vertical_sync = true;
    if (els.name.value.trim()) out.name = els.name.value.trim();
    if (els.data.value.trim()) out.model.data = els.data.value.trim();
    if (els.loaderWorkers.value !== '') out.model.loader_workers = Number(els.loaderWorkers.value);
    if (els.memory.value) out.layout.memory_bytes = Number(els.memory.value) * 1e9;
    if (els.clusterMode.value === 'levels') out.layout.levels = levelsFromText();
    else out.layout.workers = Number(els.workers.value);
    return out;
  }

  async function updateWhatIf() {
    const box = document.getElementById('what-if-body');
    if (!box || closed) return;
    controller?.abort();
    let s;
    try {
      s = spec();
    } catch (err) {
      clear(box).append(notice('error', err.message));
      return;
    }
    controller = new AbortController();
    const { model: m, layout: l } = s;
    const body = {
      model: m.name, model_args: m.args, batch_size: m.batch_size, method: l.method, schedule: l.schedule,
      weight_grads: l.weight_grads, microbatches: l.microbatches, levels: l.levels || [{ workers: l.workers, bandwidth: LOCAL_BANDWIDTH }], timeline_limit: 20000,
    };
    if (l.memory_bytes) body.memory_bytes = l.memory_bytes;
    if (l.recompute && l.recompute !== 'none') body.recompute = l.recompute; // the prediction counts it
    if (chosenSchedule()?.chunks && l.chunks) body.chunks = l.chunks;
    box.setAttribute('aria-busy', 'true');
    const progress = notice('loading', 'Planning…');
    box.prepend(progress);
    try {
      const planPublic = await planFollowingProfiling(body, controller.signal, (text) => { progress.textContent = text; });
      if (closed) return;
      await renderWhatIf(box, planPublic, drawGantt);
    } catch (err) {
      if (err.name === 'AbortError') return;
      clear(box).append(notice('error', `No plan: ${err.message}`));
    } finally {
      box.removeAttribute('aria-busy');
    }
  }
  const whatIfSoon = debounce(updateWhatIf, 500);

  /** Upload the archive (if any), register its task factory, and follow the worker's validation. */
  async function registerModel() {
    formError.textContent = '';
    const button = document.getElementById('register-model');
    button.disabled = true;
    try {
      const body = { name: els.importName.value.trim(), source: els.importPath.value.trim(), config: parseArgs(els.modelArgs.value) };
      if (els.data.value.trim()) body.data = els.data.value.trim();
      const archive = els.importArchive.files?.[0];
      if (archive) {
        importStatus.textContent = `Uploading ${archive.name}…`;
        body.context = (await uploadContext(archive)).sha256;
      }
      let model = await request('POST', '/models', { body });
      while (model.status === 'validating' && !closed) {
        importStatus.textContent = 'A worker is validating it (building the task, one batch through, splitting it)…';
        await new Promise((resolve) => { setTimeout(resolve, 1000); });
        model = await getModel(model.name);
      }
      if (model.status === 'failed') throw new Error(`${model.name} failed validation: ${model.message}`);
      importStatus.textContent = `${model.name} is ready: ${model.message}`;
      els.model.insertBefore(h('option', { value: model.name }, modelLabel(model)), els.model.lastChild);
      els.model.value = model.name;
      importBox.hidden = true;
      whatIfSoon();
    } catch (err) {
      importStatus.textContent = '';
      formError.textContent = err.message;
    } finally {
      button.disabled = false;
    }
  }

  let models = [];
  function showModelDefaults() {
    const m = models.find((x) => x.name === els.model.value);
    const defaults = Object.entries(m?.config || {}).map(([k, v]) => `${k}=${v}`).join(', ');
    els.modelArgs.placeholder = defaults ? `defaults: ${defaults}` : 'key=value, …';
    els.model.title = m?.description || '';
  }

  form.addEventListener('input', (event) => {
    if (importBox.contains(event.target)) return;
    if (event.target === els.model) showModelDefaults();
    if (event.target === els.schedule) showScheduleFields();
    importBox.hidden = els.model.value !== '__import__';
    workersBox.hidden = els.clusterMode.value !== 'local';
    levelsBox.hidden = els.clusterMode.value === 'local';
    whatIfSoon();
  });
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    formError.textContent = '';
    submit.disabled = true;
    try {
      const job = await createJob(spec());
      navigate(`/jobs/${job.id}`);
    } catch (err) {
      formError.textContent = err instanceof ApiError ? `Not submitted: ${err.message}` : err.message;
      markField(form, err.message);
      submit.disabled = false;
    }
  });

  let tuneController = null;
  /** The tuner for the form's model, workers, batch and memory cap; its table in the panel below. */
  async function tune() {
    formError.textContent = '';
    let body;
    try {
      body = tuneBody(spec());
    } catch (err) {
      formError.textContent = err.message;
      markField(form, err.message);
      return;
    }
    tuneController?.abort();
    tuneController = new AbortController();
    tunePanel.hidden = false;
    tuneButton.disabled = true;
    try {
      await chooseForMe(body, tuneBox, tuneController.signal, fillFromCandidate);
    } finally {
      tuneButton.disabled = false;
    }
  }

  function fillFromCandidate(c) {
    fillForm(els, c);
    showScheduleFields();
    if (c.chunks > 1) els.chunks.value = c.chunks;
    whatIfSoon();
  }
  tuneButton.addEventListener('click', tune);

  async function loadSchedules() {
    try {
      schedules = await listSchedules();
      clear(els.schedule).append(...schedules.map((s) => h('option', { value: s.name, title: s.description }, s.name)));
      els.schedule.value = (schedules.find((s) => s.default) || schedules[0])?.name || '';
      const ignoring = schedules.filter((s) => !s.weight_grads.length).map((s) => s.name);
      if (ignoring.length) els.weightGrads.title = `${WEIGHT_GRADS_TITLE} ${listed(ignoring)} ignore${ignoring.length === 1 ? 's' : ''} it.`;
      showScheduleFields();
    } catch (err) {
      clear(els.schedule).append(h('option', { value: '' }, 'no schedules'));
      formError.textContent = `Could not list schedules: ${err.message}`;
    }
  }
  const schedulesLoaded = loadSchedules();

  try {
    models = await listModels();
    clear(els.model).append(...models.map((m) => h('option', { value: m.name, title: m.message || m.description || m.source,
      disabled: m.status !== 'ready' }, modelLabel(m))), h('option', { value: '__import__' }, 'your own task…'));
    showModelDefaults();
    await schedulesLoaded;
    if (models.length) whatIfSoon();
  } catch (err) {
    clear(els.model).append(h('option', { value: '__import__' }, 'your own task…'));
    formError.textContent = `Could not list models: ${err.message}`;
  }
  return () => { closed = true; controller?.abort(); tuneController?.abort(); whatIfSoon.cancel(); };
}
