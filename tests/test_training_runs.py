"""train.py end to end on a tiny byte-level corpus: kill-and-resume (bitwise), bad inputs (one
clear line, nothing saved is lost) and a two-process gloo run in subprocesses; damaged
checkpoints and refusals of the training library in-process (`train_here`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from child_env import fake_devices_env
from diff_transformer.errors import UserError, message_lines
from shared_dirs import built_once

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10
WORDS = ("the king queen sword crown night day love death fool storm sea ship letter "
         "ghost castle honour blood tomorrow heaven earth father daughter brother poison "
         "wine bread war peace stars moon sun river field horse").split()


def write_corpus(directory: Path, docs: int = 40, seed: int = 0) -> None:
  """Deterministic pseudo-sentences, one .txt document each (a few KB)."""
  rng = np.random.default_rng(seed)
  directory.mkdir(parents=True)
  for i in range(docs):
    sentences = [" ".join(rng.choice(WORDS, rng.integers(4, 12))).capitalize() + "."
                 for _ in range(rng.integers(20, 60))]
    (directory / f"doc{i:03d}.txt").write_text("\n".join(sentences) + "\n")


def tiny_overrides(data_path: Path, **overrides) -> dict:
  """train.py's default config made tiny, on the prepared corpus at `data_path`."""
  values = {
      "data.name": "prepared", "data.path": str(data_path), "data.tokenizer": "byte",
      "data.seq_len": 32, "model.max_seq_len": 32, "model.vocab_size": 264,
      "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2, "model.head_dim": 8,
      "model.ffn_dim": 64, "train.global_batch_size": 8, "train.steps": STEPS,
      "train.log_every": 1, "train.eval_every": 5, "train.eval_batches": 2,
      "train.checkpoint_every": 3, "train.max_to_keep": 3, "train.warmup_steps": 2,
      "train.lr": 3e-3, "mesh.data": -1,
  }
  values.update(overrides)
  return values


def tiny_flags(data_path: Path, **overrides) -> list[str]:
  return [f"--config.{k}={v}" for k, v in tiny_overrides(data_path, **overrides).items()]


def train_here(workdir: Path, data_path: Path, **overrides) -> dict:
  """What train.py does with tiny_flags(data_path, **overrides), in this process: for the tests
  whose point is the training library's behaviour, not the program around it (the tests below
  that start train.py check its one-line errors, signals and processes)."""
  from configs import default
  from diff_transformer.config import validate
  from diff_transformer.training import train
  config = default.get_config()
  config.update_from_flattened_dict(tiny_overrides(data_path, **overrides))
  return train(validate(config), workdir)


def refused_here(workdir: Path, data_path: Path, needles: tuple[str, ...], **overrides) -> str:
  """The one-line UserError train_here raises (train.py prints it as its `error:` line)."""
  with pytest.raises(UserError) as e:
    train_here(workdir, data_path, **overrides)
  lines = message_lines(e.value)
  assert len(lines) == 1, lines
  for needle in needles:
    assert needle in lines[0], lines[0]
  return lines[0]


def env(devices: int = 1) -> dict:
  """The session's environment (its XLA_FLAGS too: these runs compile far more than they run)."""
  return fake_devices_env(devices, dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
                                        PYTHONUNBUFFERED="1"))


def train_cmd(workdir: Path, flags: list[str], *extra: str) -> list[str]:
  return [sys.executable, str(ROOT / "train.py"), f"--workdir={workdir}", *flags, *extra]


def run(workdir: Path, flags: list[str], *extra: str, devices: int = 1,
        timeout: float = 300) -> subprocess.CompletedProcess:
  return subprocess.run(train_cmd(workdir, flags, *extra), cwd=ROOT, env=env(devices),
                        capture_output=True, text=True, timeout=timeout)


def losses(workdir: Path) -> dict[int, list[float]]:
  """step -> every train loss logged for it (a resumed run logs some steps twice)."""
  out: dict[int, list[float]] = {}
  for line in (workdir / "metrics.jsonl").read_text().splitlines():
    row = json.loads(line)
    if row["kind"] == "train":
      out.setdefault(row["step"], []).append(row["loss"])
  return out


def val_losses(workdir: Path) -> dict[int, float]:
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["val_loss"] for r in rows if r["kind"] == "val"}


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
  return [l for l in proc.stderr.splitlines() if l.startswith("error:")]


def assert_one_clear_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
  assert proc.returncode != 0, proc.stdout[-2000:]
  lines = error_lines(proc)
  assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  for needle in needles:
    assert needle in lines[0], lines[0]
  return lines[0]


def tree_digest(directory: Path) -> dict[str, str]:
  return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(directory.rglob("*")) if p.is_file()}


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 240) -> None:
  deadline = time.time() + timeout
  while not predicate():
    assert proc.poll() is None, f"run ended early: {proc.stderr.read()[-3000:]}"
    assert time.time() < deadline, "timed out waiting for the run"
    time.sleep(0.1)


def logged_step(workdir: Path) -> int:
  path = workdir / "metrics.jsonl"
  if not path.exists():
    return 0
  steps = [json.loads(l)["step"] for l in path.read_text().splitlines() if l.endswith("}")]
  return max(steps, default=0)


def _prepare_corpus(base: Path) -> None:
  from diff_transformer.data import prepare_files
  write_corpus(base / "text")
  prepare_files([base / "text"], base / "byte", tokenizer="byte", val_fraction=0.1,
                progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
  return built_once(tmp_path_factory, "corpus", _prepare_corpus) / "byte"


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
  """An uninterrupted run: the losses every interrupted run must reproduce bit for bit (built
  once per session: test_reliability starts from it too)."""
  def build(workdir: Path) -> None:
    proc = run(workdir, tiny_flags(corpus))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [6, 9, 10]
    assert sorted(losses(workdir)) == list(range(1, STEPS + 1))
  return built_once(tmp_path_factory, "reference", build)


def assert_same_losses(run_dir: Path, reference: Path) -> None:
  got, want = losses(run_dir), losses(reference)
  assert sorted(got) == sorted(want)
  for step, values in got.items():
    assert all(v == want[step][0] for v in values), (step, values, want[step])  # bitwise
  assert val_losses(run_dir) == val_losses(reference)


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
  from diff_transformer.training.checkpoint import Checkpointer
  from diff_transformer.training.restore import restore_model
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


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_match_one(corpus, tmp_path):
  """2 CPU processes (gloo) on a (2, 1, 1) mesh vs one process fed the same global batches."""
  import jax
  from diff_transformer import data
  from diff_transformer.training.run_record import read_config
  from diff_transformer.training.mesh import global_batch, make_mesh
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
  dataset = data.load_dataset(config.data)
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
