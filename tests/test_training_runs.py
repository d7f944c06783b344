"""train.py end to end on a tiny byte-level corpus: kill-and-resume (bitwise), bad inputs (one
clear line, nothing saved is lost) and a two-process gloo run in subprocesses; damaged
checkpoints and refusals of the training library in-process (`train_here`).
"""
from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.helpers.runs import (ROOT, STEPS, tiny_flags, train_here, refused_here, env, train_cmd,
                                run, losses, val_losses, assert_one_clear_line, tree_digest,
                                wait_for, logged_step, assert_same_losses)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_kill_and_resume_is_exact(corpus, reference, tmp_path, sig):
  workdir = tmp_path / "run"
  flags = tiny_flags(corpus)
  proc = subprocess.Popen(train_cmd(workdir, flags), cwd=ROOT, env=env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    if sig == "SIGTERM":
      wait_for(lambda: logged_step(workdir) >= 4, proc)
    else:  # only once a checkpoint is committed (orbax renames its temp dir at the end)
      wait_for(lambda: (workdir / "checkpoints" / "3").is_dir() and logged_step(workdir) >= 4,
               proc)
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  if sig == "SIGTERM":
    assert proc.returncode == 0, err[-3000:]
    assert "SIGTERM: saved checkpoint step" in out + err
  else:
    assert proc.returncode == -signal.SIGKILL
  stopped_at = logged_step(workdir)
  assert stopped_at < STEPS
  resumed = run(workdir, flags)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  line = [l for l in resumed.stdout.splitlines() if l.startswith("Resumed from checkpoint step")]
  assert line, resumed.stdout[-2000:]
  assert_same_losses(workdir, reference)


def test_missing_data_path(tmp_path):
  refused_here(tmp_path / "run", tmp_path / "no_such_data", ("no_such_data",))
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_wrong_tokenizer_for_checkpoint(corpus, reference, tmp_path):
  from diff_transformer.data import prepare_files
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  before = tree_digest(workdir / "checkpoints")
  bpe = tmp_path / "bpe"
  prepare_files([corpus.parent / "text"], bpe, tokenizer="bpe", bpe_vocab_size=260,
                val_fraction=0.1, progress=False)
  refused_here(workdir, bpe, ("tokenizer mismatch",),
               **{"data.tokenizer": "bpe", "data.bpe_vocab_size": 260, "train.steps": 12})
  assert tree_digest(workdir / "checkpoints") == before


@pytest.mark.parametrize("overrides,needle", [
    ({"mesh.data": 3}, "mesh: data*fsdp*tensor = 3*1*1 = 3 but 8 devices"),
    ({"mesh.data": 8, "train.global_batch_size": 12}, "train.global_batch_size: 12"),
    ({"mesh.data": 1, "mesh.tensor": 8, "train.global_batch_size": 8}, "model.num_heads"),
], ids=["mesh_size", "batch", "heads"])
def test_inconsistent_mesh_or_batch(corpus, tmp_path, overrides, needle):
  proc = run(tmp_path / "run", tiny_flags(corpus, **overrides), devices=8)
  assert_one_clear_line(proc, needle)
  assert not (tmp_path / "run" / "checkpoints").exists()


def _damage(step_dir: Path, how: str) -> None:
  data_files = sorted((step_dir / "model").rglob("ocdbt.process_0/d/*"),
                      key=lambda p: p.stat().st_size)
  big = data_files[-1]
  raw = bytearray(big.read_bytes())
  if how == "flip":  # bit rot in the middle of the largest array file
    mid = len(raw) // 2
    raw[mid:mid + 64] = bytes(b ^ 0x5A for b in raw[mid:mid + 64])
    big.write_bytes(bytes(raw))
  else:  # half-written: the file stops midway
    big.write_bytes(bytes(raw[:len(raw) // 3]))


def test_corrupted_latest_checkpoint_falls_back(corpus, reference, tmp_path, capsys):
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  (workdir / "metrics.jsonl").unlink()
  _damage(workdir / "checkpoints" / "10", "flip")
  # A temp dir left by a save killed midway must be ignored too.
  (workdir / "checkpoints" / "11.orbax-checkpoint-tmp-1234" / "model").mkdir(parents=True)
  train_here(workdir, corpus)
  out = capsys.readouterr().out
  assert "checkpoint step 10" in out and "unreadable" in out, out[-3000:]
  assert "Resumed from checkpoint step 9" in out
  assert [p.name.split("-")[0] for p in (workdir / "corrupt_checkpoints").iterdir()] == ["10"]
  # Step 10 retrained from step 9 reproduces the uninterrupted run exactly.
  assert losses(workdir)[10] == losses(reference)[10]


def test_all_checkpoints_corrupted_refuses(corpus, reference, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  for step in (6, 9, 10):
    _damage(workdir / "checkpoints" / str(step), "truncate")
  before = tree_digest(workdir / "checkpoints")
  refused_here(workdir, corpus, ("no readable checkpoint", "refusing"), **{"train.steps": 12})
  assert tree_digest(workdir / "checkpoints") == before
  assert losses(workdir) == losses(reference)  # nothing trained


def test_a_stop_landing_inside_a_restore_is_not_damage(reference, tmp_path, monkeypatch):
  """A driver's SIGTERM handler raises inside whatever it interrupts; in a checkpoint read that
  is a stop, never a damaged step (nothing is set aside, the stop propagates)."""
  from diff_transformer.errors import Stopped
  from diff_transformer.runs.checkpoint import Checkpointer
  from diff_transformer.runs.restore import restore_model
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  before = tree_digest(workdir / "checkpoints")
  def interrupted(*args, **kwargs):
    raise Stopped("stopped by SIGTERM")
  monkeypatch.setattr(Checkpointer, "_restore_step", interrupted)
  with pytest.raises(Stopped):
    restore_model(workdir)
  def damaged_after_a_request(*args, **kwargs):  # the handler's raise dropped by Python
    raise OSError("read interrupted")
  monkeypatch.setattr(Checkpointer, "_restore_step", damaged_after_a_request)
  monkeypatch.setattr(Stopped, "requests", [signal.SIGTERM])
  with pytest.raises(OSError):
    restore_model(workdir)
  assert not (workdir / "corrupt_checkpoints").exists()
  assert tree_digest(workdir / "checkpoints") == before


def test_restoring_for_evaluation_builds_no_optimizer(reference, monkeypatch):
  from diff_transformer.training import step as step_module
  from diff_transformer.runs.restore import restore_model
  def no_optimizer(*args, **kwargs):
    raise AssertionError("restoring a model built an optimizer")
  monkeypatch.setattr(step_module, "make_optimizer", no_optimizer)
  model, config, step = restore_model(reference)
  assert step == STEPS and config.train.steps == STEPS
  assert model.embed.embedding[...].shape[0] == config.model.vocab_size


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_match_one(corpus, tmp_path):
  """2 CPU processes (gloo) on a (2, 1, 1) mesh vs one process fed the same global batches."""
  import jax
  from diff_transformer import data
  from diff_transformer.runs.record import read_config
  from diff_transformer.mesh import global_batch, make_mesh
  from diff_transformer.training.step import Trainer
  steps = 4
  flags = tiny_flags(corpus, **{"train.steps": steps, "train.eval_every": 100,
                                "train.checkpoint_every": 100})
  workdir, port = tmp_path / "multi", _free_port()
  procs = [subprocess.Popen(
      train_cmd(workdir, flags, f"--coordinator_address=localhost:{port}", "--num_processes=2",
                f"--process_id={i}"), cwd=ROOT, env=env(1), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for i in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  assert "(2 cpu devices, 2 processes)" in outs[0][0] + outs[0][1]
  got = {s: v[0] for s, v in losses(workdir).items()}
  assert sorted(got) == list(range(1, steps + 1))
  # The same global batches in one process: each process's slice, process 0's rows first.
  config = read_config(workdir)
  dataset = data.open_dataset(config.data)
  slices = [data.train_iterator(dataset, config.data, 8, i, 2, seed=config.data.seed)
            for i in range(2)]
  config.mesh.data = 1
  trainer = Trainer(config, make_mesh(config.mesh, devices=jax.devices()[:1]))
  state = trainer.init()
  for step in range(1, steps + 1):
    parts = [next(it) for it in slices]
    assert not np.array_equal(parts[0]["inputs"], parts[1]["inputs"])  # different slices
    batch = {k: np.concatenate([parts[0][k], parts[1][k]]) for k in parts[0]}
    state, metrics = trainer.train_step(state, global_batch(trainer.mesh, batch))
    assert abs(float(metrics["loss"]) - got[step]) <= 1e-5, (step, float(metrics["loss"]),
                                                             got[step])


def test_a_run_stops_at_its_accuracy_level_as_a_finished_run(corpus, reference, tmp_path):
  """train.stop_at_val_accuracy: the first evaluation at or above the level saves, writes
  summary.json (stopped_at_level) and ends the run; sweeps and studies count it finished. Up to
  that step it trains exactly as the uninterrupted reference did."""
  from diff_transformer import launch
  want = json.loads((reference / "summary.json").read_text())
  first_eval = val_losses(reference)
  level = 1e-6  # any argmax accuracy above 0: the first evaluation (step 5) reaches it
  summary = train_here(tmp_path, corpus, **{"train.stop_at_val_accuracy": level})
  assert summary["step"] == 5 < want["step"] and summary["stopped_at_level"]
  assert summary["val_accuracy"] >= level
  saved = json.loads((tmp_path / "summary.json").read_text())
  assert saved["step"] == 5 and saved["stopped_at_level"]
  assert 5 in [int(p.name) for p in (tmp_path / "checkpoints").iterdir()]
  assert val_losses(tmp_path) == {5: first_eval[5]}
  # finished() asks the point's config for its steps only
  sweep = SimpleNamespace(get_config=lambda point: SimpleNamespace(train=SimpleNamespace(
      steps=STEPS)))
  assert launch.finished(sweep, "p", str(tmp_path))


def test_a_run_saved_at_its_last_step_without_its_summary_is_finished_by_a_rerun(
    corpus, reference, tmp_path):
  """A run killed between its last step's save and its summary (or, before the step loop
  ignored a stop asked for at the last step, stopped there) was left unfinished by every rerun;
  the rerun now evaluates the saved state and writes the summary, with the uninterrupted run's
  final validation loss."""
  import shutil
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  want = json.loads((workdir / "summary.json").read_text())
  (workdir / "summary.json").unlink()
  summary = train_here(workdir, corpus)
  assert summary["stopped_by"] is None and summary["step"] == want["step"]
  assert json.loads((workdir / "summary.json").read_text())["val_loss"] == pytest.approx(
      want["val_loss"], abs=1e-6)
