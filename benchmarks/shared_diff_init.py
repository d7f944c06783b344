"""Shared DIFF initialisation ablation: which `model.lowrank_init` to make the default.

1. The initial attention-logit scale (rms of q.k/sqrt(d) over causal pairs, random tokens, three
   init seeds) of every variant and of Shared DIFF under each lowrank_init.
2. Shared DIFF trained on the retrieval study's task (configs/synthetic.py:shared_diff-mqar) under
   each lowrank_init, with DIFF V1 beside it as the reference, over several seeds: final held-out
   accuracy and steps to 0.9 (censored at the budget).

    python benchmarks/shared_diff_init.py --steps 500 --seeds 0,1,2

Writes benchmarks/results/shared_diff_init.json (or --out) and prints the table that
docs/results/shared_diff_init.md holds.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from configs import synthetic as presets  # noqa: E402
from diff_transformer.cli import out_file  # noqa: E402
from diff_transformer.evaluation import outliers  # noqa: E402
from diff_transformer.model.attention.shared_diff import LOWRANK_INITS  # noqa: E402
from diff_transformer.model.attention import spec_from_config  # noqa: E402
from diff_transformer.runs.folder import RunFolder  # noqa: E402
from diff_transformer.study.run_metrics import curve, first_step  # noqa: E402
from diff_transformer.stats import censored_median, summarize  # noqa: E402


def logit_rms(preset: str, lowrank_init: str | None = None) -> float:
  c = presets.get_config(preset)
  if lowrank_init:
    c.model.shared_diff.lowrank_init = lowrank_init
  return outliers.initial_logit_rms(spec_from_config(c.model), c.data.task.vocab_size)


def train(arm: str, seed: int, steps: int, root: Path) -> dict:
  variant, _, init = arm.partition(":")
  workdir = root / f"{arm.replace(':', '-')}-s{seed}"
  args = [sys.executable, "train.py", f"--config=configs/synthetic.py:{variant}-mqar",
          f"--workdir={workdir}", f"--config.train.steps={steps}",
          f"--config.train.checkpoint_every={steps}", f"--config.train.seed={seed}",
          f"--config.data.seed={seed}"]
  args += [f"--config.model.shared_diff.lowrank_init={init}"] if init else []
  if RunFolder(workdir).read_summary() is None:
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "train.log", "w") as log:
      subprocess.run(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
  points = curve(RunFolder(workdir).metric_rows())
  step, reached = first_step(points, 0.9)
  return dict(arm=arm, seed=seed, final_accuracy=points[-1][1], steps_to_90=step,
              reached_90=reached)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=500)
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--root", default="runs/ablations/shared_diff_init")
  ap.add_argument("--out", type=out_file,
                  default=str(ROOT / "benchmarks/results/shared_diff_init.json"))
  ap.add_argument("--arms",
                  default=",".join(["diff"] + [f"shared_diff:{i}" for i in LOWRANK_INITS]),
                  help="variant or shared_diff:<lowrank_init>, comma-separated")
  args = ap.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")]
  scale = {v: logit_rms(f"{v}-mqar") for v in ("transformer", "diff", "diff_v2")}
  scale.update({f"shared_diff:{i}": logit_rms("shared_diff-mqar", i) for i in LOWRANK_INITS})
  print("initial attention-logit rms:", json.dumps(scale, indent=1), flush=True)
  arms = args.arms.split(",")
  runs = [train(arm, seed, args.steps, ROOT / args.root) for seed in seeds for arm in arms]
  table: dict[str, dict[str, Any]] = {}
  for arm in arms:
    mine = [r for r in runs if r["arm"] == arm]
    median = censored_median([r["steps_to_90"] for r in mine], [r["reached_90"] for r in mine])
    table[arm] = dict(final_accuracy=summarize([r["final_accuracy"] for r in mine]),
                      reached_90=f"{sum(r['reached_90'] for r in mine)}/{len(mine)}",
                      steps_to_90_median=median if np.isfinite(median) else None,
                      per_seed=[round(r["final_accuracy"], 3) for r in mine])
  result = dict(steps=args.steps, seeds=seeds, task="configs/synthetic.py:<variant>-mqar",
                initial_logit_rms=scale, runs=runs, table=table,
                command=" ".join(["python"] + sys.argv))
  Path(args.out).write_text(json.dumps(result, indent=1))
  lines = ["| arm | initial logit rms | final held-out accuracy (mean ± std) | per seed | "
           "reached 0.9 | median steps to 0.9 |", "|---|---|---|---|---|---|"]
  for arm, t in table.items():
    fa = t["final_accuracy"]
    lines.append(f"| {arm} | {scale.get(arm, float('nan')):.3f} | "
                 f"{fa['mean']:.3f} ± {fa['std']:.3f} | {t['per_seed']} | {t['reached_90']} | "
                 f"{t['steps_to_90_median'] or 'not reached'} |")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
