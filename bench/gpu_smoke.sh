#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (one GPU, 16 cores, Python 3.12, torch with CUDA
# and transformers; no fastapi, celery, sqlalchemy or pydantic: the web stack travels as wheels).
# One run, under 10 minutes:
#
#   bash bench/gpu_smoke.sh --fetch-wheels    # here, once (PyPI): the web stack as cp312 wheels in .whl/
#   # then the device tool: run(command="PYTHON=python3 bash bench/gpu_smoke.sh", carry=[".whl"], timeout_s=600)
#   PYTHON=.venv/bin/python bash bench/gpu_smoke.sh   # here: runs up to its first CUDA check, exit 1
#
# 1. the processor, torch and transformers versions;
# 2. the NCCL posting model over every registered schedule (no GPU needed): each receive at its
#    own action deadlocks none, 8 posted ahead deadlocks every pipeline; and with several stages
#    on one GPU (host-staged pairs matched by message) posting ahead is safe (runtime/posting.py);
# 3. the first CUDA check: torch must see a GPU, else exit 1;
# 4. the GPU-only tests: the worker's device from LOCAL_RANK, checkpoints, CUDA-event timings;
# 5. pipeboard train --device cuda with 4 stage processes on the one GPU (packed by predicted
#    memory, exchanging through host memory) under 1f1b, pipedream and interleaved-1f1b, fp32 and
#    bf16: each run's samples/s and each stage's predicted and measured peak memory; then a
#    checkpoint and a resume;
# 6. bench/gpu.py: samples/s against one-process training, per-stage memory, and the CUDA-event
#    timeline against a CUDA-event-timed loop of the same model;
# 7. the service end to end: `pipeboard up` (SQLite database and broker) with one worker that
#    reports the GPU, a Llama-style job with machine.device cuda submitted and followed to the end,
#    then its summary: predicted against measured step time, memory per stage.
# Each step has its own time limit (about 8 minutes in all); after step 3 a failed step is
# printed and the script goes on.
set -u
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
step() { printf '\n== %s (%s s)\n' "$*" "$SECONDS"; }
# The web stack the service needs beyond what the lent machine has (its package list:
# /work/.library/device/KINDS.md), at the versions of the interpreter that fetches them.
WHEELS="fastapi starlette pydantic pydantic-core pydantic-settings python-dotenv typing-inspection annotated-types
opentelemetry-api uvicorn sqlalchemy greenlet alembic mako celery kombu billiard vine amqp click-didyoumean
click-repl click-plugins prompt-toolkit wcwidth tzlocal python-multipart limits deprecated"

if [ "${1:-}" = "--fetch-wheels" ]; then
    pins=$("$PY" -c 'import sys; from importlib.metadata import version; print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))' $WHEELS) || exit 1
    mkdir -p .whl
    # shellcheck disable=SC2086
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $pins || exit 1
    ls .whl | wc -l | xargs echo "wheels in .whl:"; du -sh .whl
    exit 0
fi
if ls .whl/*.whl >/dev/null 2>&1 && ! "$PY" -c 'import fastapi, celery, sqlalchemy, pydantic' 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# pipeboard's code is the package `pipeboard` (pyproject's package-dir maps it onto this folder);
# where it is not installed (the lent machine), a link named pipeboard on the path stands for it
if ! "$PY" -c 'import pipeboard.trainer' 2>/dev/null; then
    link=$(mktemp -d); ln -s "$PWD" "$link/pipeboard"; export PYTHONPATH="$link${PYTHONPATH:+:$PYTHONPATH}"
fi
PIPEBOARD=("$PY" -c 'import sys; from pipeboard.app.cli import main; sys.argv[0] = "pipeboard"; main()')

step "machine"
lscpu | grep -E '^(Model name|CPU family|Model):' | sed 's/  */ /g'
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
"$PY" -c 'import transformers; print("transformers", transformers.__version__)' 2>/dev/null || echo "transformers: not installed"
"$PY" -c 'import fastapi, celery, sqlalchemy, pydantic; print("web stack: fastapi", fastapi.__version__, "celery", celery.__version__)' 2>/dev/null \
    || echo "web stack: missing (bash bench/gpu_smoke.sh --fetch-wheels here, then carry .whl): step 7 will fail"

step "NCCL posting model"
timeout 120 "$PY" - <<'PY' || exit 1
from collections import Counter
from pipeboard.trainer.runtime.posting import NCCL_LOOKAHEAD, TAGGED_LOOKAHEAD, issued_transfers, nccl_outcome
from pipeboard.trainer.schedule import registry
from pipeboard.trainer.schedule.actions import Kind, ScheduleError
from pipeboard.trainer.schedule.builder import build

new, old, one_gpu, cases = Counter(), Counter(), Counter(), 0
for name in registry.names():
    for p in (2, 3, 4):
        for m in range(1, 9):
            try:
                s = build(name, p, m)
            except ScheduleError:
                continue
            if not any(a.kind is Kind.SEND_ACT for acts in s.actions for a in acts):
                continue
            cases += 1
            n = len(s.actions)
            new[nccl_outcome([issued_transfers(a, NCCL_LOOKAHEAD) for a in s.actions])] += 1
            old[nccl_outcome([issued_transfers(a, TAGGED_LOOKAHEAD) for a in s.actions])] += 1
            staged = {frozenset((a, b)) for a in range(n) for b in range(n) if a != b}
            one_gpu[nccl_outcome([issued_transfers(a, TAGGED_LOOKAHEAD) for a in s.actions], staged)] += 1
print(f"NCCL posting model: {cases} pipeline builds over {len(registry.names())} schedules, 2-4 stages, 1-8 microbatches;"
      f" each receive at its action: {dict(new)}; 8 posted ahead: {dict(old)};"
      f" all stages on one GPU (host memory), 8 ahead: {dict(one_gpu)}")
raise SystemExit(0 if set(new) == {"ok"} == set(one_gpu) else 1)
PY

step "CUDA"
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "CUDA is not available on this machine"
    exit 1
fi
"$PY" -c 'import json; from pipeboard.app.core.devices import probe_devices; print(json.dumps(probe_devices(), indent=1))' 2>/dev/null \
    || "$PY" -c 'import torch; [print(f"cuda:{i}", torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]'

step "GPU-only tests"
timeout 90 "$PY" -m pytest -q -p no:cacheprovider tests/trainer/test_runtime_devices.py tests/trainer/test_gpu_staging.py \
    tests/trainer/test_gpu_share.py 2>&1 | tail -5
timeout 60 "$PY" -m pytest -q -p no:cacheprovider tests/trainer/test_runtime_stage_memory.py -k cuda 2>&1 | tail -5

step "pipeboard train --device cuda: 4 stage processes on the one GPU"
work=$(mktemp -d)
show='import json, sys
s = json.loads([line for line in sys.stdin.read().splitlines() if line.startswith("{")][-1])
mem = "; ".join("stage %d %.1f/%.1f MiB" % (m["stage"], (m.get("predicted_bytes") or 0) / 2**20,
                                         (m.get("measured_bytes") or 0) / 2**20) for m in s.get("memory") or [])
print("steps %d to %d, %.0f samples/s; memory predicted/measured: %s" % (s.get("start_step") or 0, s["steps"],
                                                                       s.get("samples_per_s") or 0, mem))'
for precision in fp32 bf16; do
    for schedule in 1f1b pipedream interleaved-1f1b; do
        t0=$SECONDS
        out=$(timeout 60 "${PIPEBOARD[@]}" train --model mlp --model-arg width=2048 --stages 4 --schedule "$schedule" \
              --batch-size 256 --microbatches 8 --steps 20 --precision "$precision" --device cuda --json 2>&1)
        line=$(printf '%s\n' "$out" | "$PY" -c "$show" 2>/dev/null) || line="failed: $(printf '%s\n' "$out" | tail -2 | tr '\n' ' ')"
        echo "$schedule $precision ($(( SECONDS - t0 )) s): $line"
    done
done
for run in "--steps 10 --checkpoint-every 5" "--steps 20 --resume"; do  # a checkpoint, then a resume from it
    # shellcheck disable=SC2086
    out=$(timeout 75 "${PIPEBOARD[@]}" train --model mlp --stages 4 --schedule 1f1b --batch-size 64 --microbatches 4 \
          --device cuda --checkpoint-dir "$work/ckpt" --json $run 2>&1)
    line=$(printf '%s\n' "$out" | "$PY" -c "$show" 2>/dev/null) || line="failed: $(printf '%s\n' "$out" | tail -2 | tr '\n' ' ')"
    echo "checkpoint run ($run): $line"
done

step "bench/gpu.py (one process on the GPU against 4 stage processes sharing it; the timeline)"
timeout 120 "$PY" bench/gpu.py --device cuda --steps 40 --workers 4 --schedules 1f1b --precisions fp32,bf16 2>&1 | tail -12

step "the service end to end: a Llama-style job on cuda"
port=18765
export PIPEBOARD_DATA_DIR="$work/data" PIPEBOARD_AUTH=off PIPEBOARD_READ_AUTH=off PIPEBOARD_HEARTBEAT_SECONDS=1
"${PIPEBOARD[@]}" up --port "$port" --workers 1 >"$work/up.log" 2>&1 &
up_pid=$!
cat >"$work/job.yaml" <<'YAML'
version: 2
name: gpu-smoke-llama
model: {name: llama-text, args: {layers: 4, dim: 256, heads: 8, seq_len: 128}, batch_size: 32}
layout: {workers: 1, schedule: gpipe, microbatches: 4}
length: {steps: 40}
machine: {device: cuda, precision: bf16}
YAML
timeout 180 "$PY" - "$port" "$work/job.yaml" <<'PY' || { echo "service run failed; the log's tail:"; tail -20 "$work/up.log"; }
import json, subprocess, sys, time
import httpx
port, spec = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}"
deadline = time.monotonic() + 60
while True:  # up, with its worker reporting the GPU
    try:
        health = httpx.get(f"{base}/api/v1/health", timeout=2).json()
        if health.get("workers") == 1:
            break
    except (httpx.HTTPError, ValueError):
        pass
    if time.monotonic() > deadline:
        sys.exit("the service did not come up in 60 s")
    time.sleep(1)
print("health:", json.dumps(health)[:800])  # each worker's devices
done = subprocess.run([sys.executable, "-c", "import sys; from pipeboard.app.cli import main; sys.argv[0] = 'pipeboard'; main()",
                       "submit", spec, "--wait", "--quiet", "--url", base], capture_output=True, text=True, timeout=150)
print(done.stdout.strip()[-400:], done.stderr.strip()[-400:])
job_id = int(done.stdout.split()[1])
job = httpx.get(f"{base}/api/v1/jobs/{job_id}", timeout=10).json()
s = job.get("summary") or {}
f = s.get("fidelity") or {}
print(f"job {job_id}: {job.get('status')}; device {job.get('spec', {}).get('machine', {}).get('device')}; "
      f"{s.get('samples_per_s') or 0:.0f} samples/s; step time predicted {f.get('predicted_step_s')} s, "
      f"measured {f.get('measured_step_s')} s ({f.get('basis')}; {f.get('device_note')})")
for m in s.get("memory") or []:
    print(f"  stage {m['stage']}: memory predicted {m.get('predicted_bytes')} B, measured {m.get('measured_bytes')} B")
sys.exit(0 if job.get("status") == "succeeded" else 1)
PY
kill -TERM "$up_pid" 2>/dev/null  # `pipeboard up` stops its API server and worker with it
wait "$up_pid" 2>/dev/null
rm -rf "$work"
echo "gpu_smoke done in $SECONDS s"
