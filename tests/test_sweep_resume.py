"""A sweep of real (tiny) training runs: rerunning after an interruption redoes no finished point
and resumes the interrupted one; then the collected results fit and report."""
import importlib.util
import json
import os
import shutil

from tests.helpers.runs import ROOT, tiny_flags, write_corpus

from diff_transformer import launch
from diff_transformer.runs.folder import RunFolder
from diff_transformer.sweeps import report
from diff_transformer.sweeps.definition import Sweep

SWEEP_FILE = """
from configs import default
from diff_transformer.sweeps.definition import Sweep

def size(width):
  def make(variant):
    c = default.get_config()
    c.model.variant, c.model.d_model, c.model.num_layers, c.model.head_dim = variant, width, 1, 8
    c.model.num_heads = width // 16
    c.model.ffn_dim = 2 * width
    return c
  return make

SWEEP = Sweep("tiny", sizes={"a": size(16), "b": size(32), "c": size(48)}, budgets={"4": 4},
              variants=("diff",))
get_config = SWEEP.get_config
"""


def test_interrupted_sweep_resumes_without_redoing_finished_points(tmp_path, monkeypatch):
  from diff_transformer.data import prepare_files
  write_corpus(tmp_path / "text", docs=12)
  prepare_files([tmp_path / "text"], tmp_path / "byte", tokenizer="byte", val_fraction=0.2,
                progress=False)
  sweep_file = tmp_path / "tiny_sweep.py"
  sweep_file.write_text(SWEEP_FILE)
  flags = [f for f in tiny_flags(tmp_path / "byte", **{"train.steps": 4, "train.eval_every": 4,
                                                         "train.checkpoint_every": 2})
           if not f.split("=")[0].split(".")[-1] in ("d_model", "num_layers", "num_heads",
                                                      "head_dim", "ffn_dim")]
  monkeypatch.chdir(ROOT)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  spec = importlib.util.spec_from_file_location("tiny_sweep", sweep_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  sweep: Sweep = module.SWEEP
  root = tmp_path / "runs"

  first = launch.run(sweep, str(sweep_file), str(root), extra_args=tuple(flags))
  assert set(first.values()) == {"ran"} and len(first) == 3
  finished = {p: os.path.getmtime(RunFolder(root / p).summary) for p in first}

  # Interrupt the last point: it keeps its step-2 checkpoint but never finished.
  last = sweep.points()[-1]
  (RunFolder(root / last).summary).unlink()
  shutil.rmtree(root / last / "checkpoints" / "4")

  second = launch.run(sweep, str(sweep_file), str(root), extra_args=tuple(flags))
  assert second == {p: ("ran" if p == last else "skipped") for p in first}
  for p in first:
    if p != last:
      assert os.path.getmtime(RunFolder(root / p).summary) == finished[p]  # untouched
  summary = json.loads((RunFolder(root / last).summary).read_text())
  assert summary["step"] == 4
  rows = [json.loads(l) for l in (root / last / "metrics.jsonl").read_text().splitlines()]
  train_steps = [r["step"] for r in rows if r["kind"] == "train"]
  assert train_steps.count(1) == 1 and train_steps.count(3) == 2  # resumed at step 2, not redone
  assert launch.run(sweep, str(sweep_file), str(root), extra_args=tuple(flags)) == {
      p: "skipped" for p in first}

  result = report.write_report(sweep, str(root))
  assert len(result["points"]) == 3 and "diff" in result["fits"]["N"]
  assert (root / "report.md").exists() and (root / "loss_vs_N.png").exists()
