"""Runs per hour of a study's children: one child at a time using every core, against one
single-threaded child per core at once (study.py --jobs), on the default retrieval study's runs.

  JAX_PLATFORMS=cpu python benchmarks/study_children.py              # 4 runs per mode, 2 rounds
  JAX_PLATFORMS=cpu python benchmarks/study_children.py --runs 2 --rounds 1 --steps 100

Each round trains the same `--runs` points (the four variants' grid points, `--steps` steps, no
early stop, so every run does the same work) once per mode, the modes alternating within the
round so a change in the machine's load hits both; workdirs are fresh each time. The runs' own
figures (final loss) are compared across modes: pinning a child to one core must not change
what it computes. Writes benchmarks/results/study_children.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diff_transformer import cli  # noqa: E402
from diff_transformer import launch  # noqa: E402
from diff_transformer.runs.folder import RunFolder  # noqa: E402

STUDY_FILE = "configs/studies/retrieval.py"


def one_mode(study, points: list[str], jobs: int, steps: int) -> tuple[float, dict]:
  root = Path(tempfile.mkdtemp(prefix=f"children{jobs}_"))
  args = (f"--config.train.steps={steps}", f"--config.train.checkpoint_every={steps}",
          "--config.train.eval_every=25", "--config.train.stop_at_val_accuracy=0.0")
  start = time.perf_counter()
  status = launch.run(study, STUDY_FILE, str(root), points=points, extra_args=args,
                            jobs=jobs)  # a grid point's name carries its lr and seed
  seconds = time.perf_counter() - start
  losses = {p: (RunFolder(root / p).read_summary() or {}).get("val_loss") for p in points}
  shutil.rmtree(root)
  assert all(s == "ran" for s in status.values()), status
  return seconds, losses


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", type=int, default=4)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--out", type=cli.out_file,
                      default=str(ROOT / "benchmarks/results/study_children.json"))
  a = parser.parse_args()
  os.chdir(ROOT)
  study = cli.load_definition(STUDY_FILE, "study", "STUDY").validate(design=False)
  points = [study.grid_point(v, study.lr_grid[1], study.lr_grid_seeds[0])
            for v in study.variants][:a.runs]
  rows, losses = [], {}
  for r in range(a.rounds):
    for jobs in ((1, 2) if r % 2 == 0 else (2, 1)):
      load = os.getloadavg()[0]
      seconds, losses[jobs] = one_mode(study, points, jobs, a.steps)
      rows.append(dict(round=r, jobs=jobs, seconds=round(seconds, 1), load_before=load,
                       runs_per_hour=round(len(points) * 3600 / seconds, 1)))
      print(f"round {r}: {jobs} child(ren) at once: {seconds:.1f} s for {len(points)} runs "
            f"({rows[-1]['runs_per_hour']} runs/h; load {load:.2f} before)", flush=True)
  same = losses[1] == losses[2]
  by_jobs = {j: sorted(x["runs_per_hour"] for x in rows if x["jobs"] == j) for j in (1, 2)}
  ratios = sorted(b["runs_per_hour"] / a_["runs_per_hour"] for a_, b in zip(
      [x for x in rows if x["jobs"] == 1], [x for x in rows if x["jobs"] == 2]))
  result = dict(
      what="runs per hour of the retrieval study's runs: jobs=1 (one child, every core) vs "
           "jobs=2 (one single-threaded child per core)",
      machine=f"{platform.machine()}, {os.cpu_count()} cores", steps=a.steps, points=points,
      rows=rows, runs_per_hour=by_jobs, speedup_two_children=ratios,
      identical_final_losses=same, date=time.strftime("%Y-%m-%d"))
  Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
  print(f"two children / one child, per round: {[round(x, 3) for x in ratios]}; final losses "
        f"identical across modes: {same}; wrote {a.out}")


if __name__ == "__main__":
  main()
