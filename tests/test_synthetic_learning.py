"""The instruments read true: a small Transformer trained briefly on plain MQAR (the smallest
setting found that learns: configs/synthetic.py:transformer-mqar_plain) recalls >= 0.9 of
held-out answers, and its attention at the answer position goes to the asked pair.

Marked long (about 25 s of training on 2 cores, more beside another test): run it with
`--run-long`. Every run of the suite still trains and evaluates on the synthetic tasks end to end
(tests/test_study.py, tests/test_synthetic.py); this test is the one that needs them learned.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from diff_transformer.xla_flags import optimized_env
from configs import synthetic as presets
from diff_transformer.evaluation import Settings, evaluate

ROOT = Path(__file__).resolve().parents[1]
PRESET = "transformer-mqar_plain"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """train.py in a child at XLA's default optimisation level: hundreds of steps, so its run
  time, not its compile time, dominates."""
  workdir = tmp_path_factory.mktemp("mqar_plain")
  steps = presets.get_config(PRESET).train.steps
  proc = subprocess.run(
      [sys.executable, str(ROOT / "train.py"), f"--config=configs/synthetic.py:{PRESET}",
       f"--workdir={workdir}", f"--config.train.eval_every={steps}",
       f"--config.train.checkpoint_every={steps}"],
      cwd=ROOT, env=optimized_env(), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir, json.loads((workdir / "summary.json").read_text())


@pytest.mark.long  # 300 real training steps: run time, not compile time (--run-long)
def test_plain_mqar_is_learned_by_the_transformer(trained):
  workdir, summary = trained
  settings = Settings(task_rows=256, task_attention_rows=8, seed=3)
  results = evaluate(workdir, ["task", "attention"], settings=settings)
  task = results["task"]
  print(f"plain MQAR answer accuracy {task['accuracy']:.3f} (best shortcut {task['floor']:.3f}), "
        f"val accuracy during training {summary['val_accuracy']:.3f}")
  assert task["accuracy"] >= 0.9 and summary["val_accuracy"] >= 0.9
  assert task["by_query"][0] >= 0.9  # the first query: pure recall, no elimination possible
  shares = results["attention"]["by_layer"]
  best = max(shares[k]["answer"] for k in shares if k.startswith("layer_"))
  assert best > 0.5  # some layer reads the asked pair itself
