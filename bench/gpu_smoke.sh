#!/usr/bin/env bash
# The one prepared script for a lent GPU machine (one GPU, 16 cores, Python 3.12, torch with CUDA,
# transformers; no web stack: the service end to end is not in it). One run, under 10 minutes:
#
#   PYTHON=python3 bash bench/gpu_smoke.sh          # on the lent machine, from the repository root
#   PYTHON=.venv/bin/python bash bench/gpu_smoke.sh # here: runs up to its first CUDA check, exit 1
#
# 1. the processor, torch and transformers versions;
# 2. the NCCL posting model over every registered schedule (no GPU needed): each receive at its
#    own action deadlocks none, 8 posted ahead deadlocks every pipeline (runtime/posting.py);
# 3. the first CUDA check: torch must see a GPU, else exit 1;
# 4. the GPU-only tests: the worker's device from LOCAL_RANK, the worker's GPU probe;
# 5. bench/gpu.py: samples/s of one process on the GPU (the baseline) and of the pipeline runs;
# 6. pipeboard train --device cuda under 1f1b, pipedream and interleaved-1f1b, fp32 and bf16, on
#    2 stages, then a checkpoint and a resume. Several stages on one GPU are not built yet (NCCL
#    refuses two ranks on one device): on a one-GPU machine these runs are expected to fail with
#    that one line, and the script prints each outcome and goes on.
# Each step has its own time limit; the script never stops on a failed run after step 3.
set -u
PY=${PYTHON:-python3}
cd "$(dirname "$0")/.."
step() { printf '\n== %s\n' "$*"; }
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

step "NCCL posting model"
timeout 120 "$PY" - <<'PY' || exit 1
from collections import Counter
from pipeboard.trainer.runtime.posting import NCCL_LOOKAHEAD, TAGGED_LOOKAHEAD, issued_transfers, nccl_outcome
from pipeboard.trainer.schedule import registry
from pipeboard.trainer.schedule.actions import Kind, ScheduleError
from pipeboard.trainer.schedule.build import build

new, old, cases = Counter(), Counter(), 0
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
            new[nccl_outcome([issued_transfers(a, NCCL_LOOKAHEAD) for a in s.actions])] += 1
            old[nccl_outcome([issued_transfers(a, TAGGED_LOOKAHEAD) for a in s.actions])] += 1
print(f"NCCL posting model: {cases} pipeline builds over {len(registry.names())} schedules, 2-4 stages, 1-8 microbatches;"
      f" each receive at its action: {dict(new)}; 8 posted ahead: {dict(old)}")
raise SystemExit(0 if set(new) == {"ok"} else 1)
PY

step "CUDA"
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "CUDA is not available on this machine"
    exit 1
fi
"$PY" -c 'import json; from pipeboard.app.core.devices import probe_devices; print(json.dumps(probe_devices(), indent=1))' 2>/dev/null \
    || "$PY" -c 'import torch; [print(f"cuda:{i}", torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]'

step "GPU-only tests"
timeout 120 "$PY" -m pytest -q -p no:cacheprovider tests/trainer/test_runtime_devices.py tests/trainer/test_runtime_posting.py 2>&1 | tail -5
# action times from CUDA events and the allocator-peak memory meter (instrument.py)
timeout 60 "$PY" -m pytest -q -p no:cacheprovider tests/trainer/test_runtime_stage_memory.py -k cuda 2>&1 | tail -5

step "bench/gpu.py (one process on the GPU, then the pipelines)"
timeout 150 "$PY" bench/gpu.py --device cuda --steps 40 --schedules 1f1b,pipedream 2>&1 | tail -12

step "pipeboard train --device cuda"
work=$(mktemp -d)
for precision in fp32 bf16; do
    for schedule in 1f1b pipedream interleaved-1f1b; do
        t0=$(date +%s)
        out=$(timeout 90 "${PIPEBOARD[@]}" train --model mlp --stages 2 --schedule "$schedule" --batch-size 64 \
              --microbatches 4 --steps 20 --precision "$precision" --device cuda 2>&1 | tail -2)
        echo "$schedule $precision ($(( $(date +%s) - t0 )) s): ${out//$'\n'/ | }"
    done
done
timeout 90 "${PIPEBOARD[@]}" train --model mlp --stages 2 --schedule 1f1b --batch-size 64 --microbatches 4 \
    --steps 10 --device cuda --checkpoint-dir "$work/ckpt" --checkpoint-every 5 2>&1 | tail -1
timeout 90 "${PIPEBOARD[@]}" train --model mlp --stages 2 --schedule 1f1b --batch-size 64 --microbatches 4 \
    --steps 20 --device cuda --checkpoint-dir "$work/ckpt" --resume 2>&1 | tail -1
rm -rf "$work"
