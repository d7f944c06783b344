"""eval.py end to end on a tiny run trained on 8 fake devices (data 4, fsdp 2): the same `loss`
result on one device and on a mesh that splits data, fsdp and tensor, every suite in --quick
mode, --compare, and bad inputs (through `parse_suites` and `evaluate`, the functions eval.py
calls; eval.py's own one-line ending is tests/test_reliability.py's)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.child_env import fake_devices_env

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(fake_devices_env(8), JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
TINY = ["--config.model.vocab_size=264", "--config.model.d_model=64",
        "--config.model.num_layers=2", "--config.model.num_heads=2", "--config.model.head_dim=16",
        "--config.model.ffn_dim=128", "--config.model.max_seq_len=128",
        "--config.data.seq_len=128", "--config.data.tokenizer=byte",
        "--config.train.global_batch_size=8", "--config.train.steps=3",
        "--config.train.warmup_steps=1", "--config.train.checkpoint_every=3",
        "--config.train.eval_every=3", "--config.train.eval_batches=1"]


def run(*args, check=True):
  proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True,
                        text=True, timeout=600)
  if check and proc.returncode != 0:
    raise AssertionError(f"{args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny DIFF model trained 3 steps on a (data 4, fsdp 2) mesh, on the repo's own text."""
  tmp = tmp_path_factory.mktemp("eval_run")
  from diff_transformer.data import prepare_files
  texts = tmp / "texts"
  texts.mkdir()
  for i, source in enumerate(sorted(ROOT.glob("diff_transformer/**/*.py"))):
    (texts / f"{i:03d}_{source.stem}.txt").write_text(source.read_text("utf-8"))
  prepare_files([texts], tmp / "data", tokenizer="byte", val_fraction=0.1, progress=False)
  workdir = tmp / "run"
  run("train.py", "--config=configs/default.py", f"--workdir={workdir}",
      "--config.data.name=prepared", f"--config.data.path={tmp / 'data'}",
      "--config.mesh.data=4", "--config.mesh.fsdp=2", "--config.mesh.tensor=1", *TINY)
  (tmp / "icl.jsonl").write_text("".join(
      json.dumps(dict(text=f"{w} {w} {w}", label=l)) + "\n"
      for w, l in [("sun", "warm"), ("ice", "cold"), ("fire", "warm"), ("snow", "cold")] * 6))
  return workdir


# The same validation rows for every `loss` run. 16 rows a batch: the suites' 10 needle prompts
# then decode as one batch, which halves the programs the quantization suite compiles per bit
# width (its needle and loss passes; measured 41 -> 31 CPU s for every suite).
LOSS_ROWS = ("--val_batches=4", "--batch_size=16")


def eval_loss(workdir, *mesh_flag) -> float:
  run("eval.py", f"--workdir={workdir}", "--suites=loss", *LOSS_ROWS, *mesh_flag)
  return loss_of(workdir)


def loss_of(workdir) -> float:
  return json.loads((workdir / "eval" / "loss.json").read_text())["loss"]


@pytest.fixture(scope="module")
def every_suite(trained) -> float:
  """Every suite in --quick mode on one device (no --mesh); returns its `loss` result (the rows
  eval_loss reads), the one-device side of the mesh comparison."""
  run("eval.py", f"--workdir={trained}", "--suites=all", "--quick", "--needle_configs=1x1",
      "--needle_lengths=128", f"--icl_data={trained.parent / 'icl.jsonl'}",
      "--max_new_tokens=8", *LOSS_ROWS)
  return loss_of(trained)


def test_loss_is_the_same_on_any_mesh(trained, every_suite):
  on_every_axis = eval_loss(trained, "--mesh=2,2,2")  # data, fsdp and tensor all split
  assert every_suite == pytest.approx(on_every_axis, abs=1e-5)  # and on one device


def test_every_suite_quick_then_compare(trained, every_suite, tmp_path):
  from diff_transformer.evaluation import report
  out = trained / "eval"
  for suite in ("loss", "long_context", "needle", "attention", "outliers", "quantization", "icl",
                "generate"):
    result = json.loads((out / f"{suite}.json").read_text())
    assert result["suite"] == suite and result["variant"] == "diff"
  report_md = (out / "report.md").read_text()
  assert "## needle" in report_md and "A1 - lambda A2" in report_md
  for plot in ("needle.png", "long_context.png", "quantization.png", "icl.png", "attention.png"):
    assert (out / plot).stat().st_size > 0
  gen = json.loads((out / "generate.json").read_text())
  assert all(s["greedy_matches_full_forward"] for s in gen["samples"])
  assert gen["kv_cache"]["key_heads"] == 2 * 2 and gen["kv_cache"]["value_width"] == 2 * 16
  # --compare (what eval.py --compare calls): the same run twice under two names.
  other = tmp_path / "copy"
  shutil.copytree(trained, other)
  report.compare([str(trained), str(other)], tmp_path / "cmp")
  table = (tmp_path / "cmp" / "compare.md").read_text()
  assert "run (diff)" in table and "copy (diff)" in table and "val loss" in table
  assert (tmp_path / "cmp" / "long_context.png").is_file()


def refusal(workdir, suite: str, **settings) -> str:
  """The one-line EvalError `evaluate` (what eval.py runs) raises for this workdir and setting."""
  from diff_transformer.evaluation import EvalError, Settings, evaluate
  with pytest.raises(EvalError) as e:
    evaluate(workdir, [suite], settings=Settings.for_mode(True, **settings))
  assert "\n" not in str(e.value)
  return str(e.value)


def test_unknown_suite_is_one_line_before_the_run_is_read():
  """What eval.py checks first (its own one-line ending: tests/test_reliability.py)."""
  from diff_transformer.evaluation import EvalError, parse_suites
  with pytest.raises(EvalError, match=r"^--suites: unknown suite 'nedle'; choose from [^\n]*$"):
    parse_suites("loss,nedle", task=None)


def test_workdir_without_checkpoints(trained, tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  for name in ("config.json", "tokenizer_record.json"):
    shutil.copy(trained / name, empty / name)
  assert "no checkpoint" in refusal(empty, "loss")
  assert "not a training workdir" in refusal(tmp_path / "nothing", "loss")


def test_context_beyond_the_model(trained):
  assert ("context length 4096 exceeds the model's max_seq_len 128"
          in refusal(trained, "long_context", context_len=4096))
  assert ("context length 512 exceeds the model's max_seq_len 128"
          in refusal(trained, "needle", needle_lengths=(512,)))
