"""The export capture's cost against the fx capture it replaced, in alternating pairs.

    git archive 67dbd17 | (mkdir -p /tmp/fx-era && tar -x -C /tmp/fx-era)   # the code before export
    .venv/bin/python bench/capture_speed.py --old /tmp/fx-era [--pairs 5]

- **capture plus profile**, whole process: a fresh Python process builds the zoo's ``llama-text``
  as a 24-block Llama (hidden 512, 8 heads, sequence 64), captures and profiles it at batch 8
  (1 warm-up step, 2 measured); the fx era took it through its hand-built Llama family, so both
  capture the same model. Wall seconds, new / old per pair.
- **training samples/s**: ``pipeboard train`` of the zoo's ``mlp`` and ``gpt2-text`` on 2 stages
  under 1f1b, new / old per pair.

Each pair runs old and new back to back, the order alternating, so both see the same load. The old
code runs from ``--old`` (a directory holding its ``trainer`` and ``app``), imported as
``pipeboard`` ahead of this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # bench/profile.py shadows stdlib
sys.path.insert(0, str(HERE.parent))

from pipeboard.trainer.hostinfo import cpu_name  # noqa: E402

PROFILE = """
import time
t0 = time.perf_counter()
from pipeboard.trainer.spec import load_task
from pipeboard.trainer.profile.profiler import profile_model
task = load_task("llama-text", {"layers": 24, "dim": 512, "heads": 8, "seq_len": 64})
prof = profile_model(task.model, task.example_input(8), batch_size=8, warmup=1, repeats=2)
print(len(prof.layers), round(time.perf_counter() - t0, 2))
"""

TRAIN = {
    "mlp": ["--model", "mlp", "--stages", "2", "--schedule", "1f1b", "--batch-size", "64", "--microbatches", "4",
            "--steps", "150"],
    "gpt2-text": ["--model", "gpt2-text", "--stages", "2", "--schedule", "1f1b", "--batch-size", "32",
                  "--microbatches", "4", "--steps", "40"],
}


def env_for(old: Path | None, shim: Path) -> dict:
    env = dict(os.environ)
    if old is not None:  # `pipeboard` resolves to the old tree ahead of the installed checkout
        env["PYTHONPATH"] = str(shim) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def make_shim(old: Path) -> Path:
    shim = Path(tempfile.mkdtemp(prefix="pipeboard-old-"))
    pkg = shim / "pipeboard"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for part in ("trainer", "app"):
        (pkg / part).symlink_to(old / part)
    return shim


def profile_seconds(env: dict) -> float:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PROFILE], env=env, capture_output=True, text=True, cwd=HERE.parent)
    if out.returncode != 0:
        raise SystemExit(f"profile failed: {out.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - started


def samples_per_s(env: dict, model: str) -> float:
    code = "import sys; from pipeboard.app.cli import main; sys.argv = ['pipeboard'] + sys.argv[1:]; main()"
    out = subprocess.run([sys.executable, "-c", code, "train", *TRAIN[model], "--json"], env=env,
                         capture_output=True, text=True, cwd=HERE.parent)
    if out.returncode != 0:
        raise SystemExit(f"train {model} failed: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"])


def pairs(n: int, measure, old_env: dict, new_env: dict) -> list[tuple[float, float]]:
    """(new, old) per pair, old first in even pairs and new first in odd ones."""
    out = []
    for i in range(n):
        if i % 2 == 0:
            old = measure(old_env)
            new = measure(new_env)
        else:
            new = measure(new_env)
            old = measure(old_env)
        out.append((new, old))
        print(f"  pair {i + 1}: new {new:.3f}, old {old:.3f}, new/old {new / old:.3f}", flush=True)
    return out


def summary(label: str, got: list[tuple[float, float]]) -> None:
    ratios = [n / o for n, o in got]
    olds = [o for _, o in got]
    spread = (max(olds) - min(olds)) / statistics.median(olds)
    print(f"{label}: median new/old {statistics.median(ratios):.3f} (pairs {min(ratios):.3f}-{max(ratios):.3f}); "
          f"old runs' own spread {spread:.1%} of their median", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, type=Path, help="a tree of the code before the export capture")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--parts", default="profile,train")
    args = parser.parse_args()
    old = args.old.resolve()
    if not (old / "trainer" / "profile" / "fxgraph.py").exists():
        raise SystemExit(f"--old: {old} holds no trainer/profile/fxgraph.py (not the fx-era code)")
    shim = make_shim(old)
    old_env, new_env = env_for(old, shim), env_for(None, shim)
    print(f"capture speed: {cpu_name()}, {os.cpu_count()} CPUs, {args.pairs} alternating pairs", flush=True)
    parts = args.parts.split(",")
    if "profile" in parts:
        print("capture + profile of a 24-block Llama (hidden 512), whole process, seconds:", flush=True)
        summary("capture + profile", pairs(args.pairs, profile_seconds, old_env, new_env))
    if "train" in parts:
        for model in TRAIN:
            print(f"{model}: samples/s, 2 stages, 1f1b:", flush=True)
            summary(f"{model} samples/s", pairs(args.pairs, lambda env, m=model: samples_per_s(env, m), old_env,
                                                  new_env))


if __name__ == "__main__":
    main()
