"""Tiny training runs on a tiny byte-level corpus: flags, in-process and subprocess runs, and
readers of what a run logged (tests/conftest.py builds the shared corpus and reference run)."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from diff_transformer.errors import UserError, message_lines
from tests.helpers.child_env import fake_devices_env

ROOT = Path(__file__).resolve().parents[2]
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
  that start train.py check its one-line errors, signals and processes). An init_from_hf
  folder is converted as train.py converts it."""
  from configs import default
  from diff_transformer.config import validate
  from diff_transformer.training import train
  config = default.get_config()
  config.update_from_flattened_dict(tiny_overrides(data_path, **overrides))
  start_params = None
  if config.init_from_hf:
    from diff_transformer.interop import hf_import
    start_params = functools.partial(hf_import.import_params, folder=config.init_from_hf)
  return train(validate(config), workdir, start_params=start_params)


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


def prepare_corpus(base: Path) -> None:
  from diff_transformer.data import prepare_files
  write_corpus(base / "text")
  prepare_files([base / "text"], base / "byte", tokenizer="byte", val_fraction=0.1,
                progress=False)


def assert_same_losses(run_dir: Path, reference: Path) -> None:
  got, want = losses(run_dir), losses(reference)
  assert sorted(got) == sorted(want)
  for step, values in got.items():
    assert all(v == want[step][0] for v in values), (step, values, want[step])  # bitwise
  assert val_losses(run_dir) == val_losses(reference)
