"""Faults and bad input: divergence never leaves a bad checkpoint to resume from, a failed save
stops the run in one line, one writer per workdir, a changed batch size and a change of code are
recorded (on the resume after a divergence), and every bad input is one line.

Every program (train.py, eval.py, study.py, sweep.py, export.py, aot_compile.py, prepare_data.py,
the lm-eval adapter) is started once with bad input: the whole of stderr is one `error:` line, exit
status 2, no traceback (cli.run). The training library's refusals (workdir, data, config.json,
saves) run in-process (test_training_runs.train_here) and must be one-line UserErrors, which cli.run
prints as that line.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diff_transformer import provenance
from diff_transformer.errors import UserError, message_lines
from diff_transformer.runs.folder import RunFolder
from diff_transformer.runs.record import read_code_versions
from diff_transformer.runs.restore import restore_model
from tests.helpers.runs import (ROOT, assert_one_clear_line, env, logged_step, losses,
                                refused_here, tiny_flags, train_cmd, train_here, tree_digest,
                                wait_for)


def run_program(script: str, *args: str, cwd: Path = ROOT, timeout: float = 300
                ) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(ROOT / script), *args], cwd=cwd, env=env(),
                        capture_output=True, text=True, timeout=timeout)


def assert_single_stderr_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
  """The whole of stderr is the one `error:` line (exit 2, no traceback)."""
  line = assert_one_clear_line(proc, *needles)
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  assert proc.stderr.strip() == line, proc.stderr[-3000:]
  return line


def _mount_tmpfs(target: Path, options: str) -> bool:
  """A small private file system (root only); False where mounting is not permitted."""
  target.mkdir(parents=True, exist_ok=True)
  return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                        capture_output=True).returncode == 0


def _umount(target: Path) -> None:
  subprocess.run(["umount", str(target)], capture_output=True)


# ---- faults --------------------------------------------------------------------------------
def test_divergence_keeps_only_good_checkpoints_and_resume_trains(corpus, reference, tmp_path,
                                                                 capsys):
  """Also the resume with a changed batch size and under other code: each said once, recorded,
  and trained on."""
  from flax import nnx
  import jax
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  before = tree_digest(workdir / "checkpoints" / "10")
  # A checkpoint every step while the learning rate blows the parameters up.
  line = refused_here(workdir, corpus, ("not finite", "last good checkpoint (step 10)"),
                      **{"train.steps": 30, "train.lr": 1e30, "train.final_lr": 1e30,
                         "train.checkpoint_every": 1})
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [6, 9, 10], line
  assert tree_digest(workdir / "checkpoints" / "10") == before  # the pre-blow-up parameters
  model, _, step = restore_model(workdir)
  assert step == 10 and all(np.isfinite(np.asarray(p)).all()
                            for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  # Resuming with a sane learning rate (and twice the batch, under another commit's record)
  # trains on without NaN.
  versions = read_code_versions(workdir)
  versions[-1]["commit"] = "0" * 40
  RunFolder(workdir).code_version.write_text(json.dumps(versions))
  planted = versions[-1]
  capsys.readouterr()
  train_here(workdir, corpus, **{"train.steps": 13, "train.checkpoint_every": 1,
                                 "train.global_batch_size": 16})
  out = capsys.readouterr()
  assert "Resumed from checkpoint step 10" in out.out
  got = losses(workdir)
  assert all(np.isfinite(got[s]).all() for s in (11, 12, 13)), got
  _, _, step = restore_model(workdir)
  assert step == 13
  said = [l for l in (out.out + out.err).splitlines() if "global_batch_size 16" in l]
  assert len(said) == 1 and "(was 8)" in said[0], out.out[-2000:]
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  resume = [r for r in rows if r["kind"] == "resume"]
  batch = [r for r in resume if "global_batch_size" in r]
  assert batch == [dict(batch[0], step=10, previous_global_batch_size=8, global_batch_size=16)]
  # (a commit landing while the suite runs may add a code-change row of the refused run too)
  code = [r for r in resume if r.get("code_was", "").startswith("0" * 10)]
  assert code == [dict(code[0], step=10)], resume
  assert code[0]["code_was"] == provenance.label(planted)
  assert code[0]["code_now"] == provenance.label(provenance.code_version())  # this process's
  said = [l for l in out.out.splitlines() if "under other code" in l]
  expected = f"under other code ({code[0]['code_now']}; was {code[0]['code_was']})"
  assert len(said) == 1 and said[0].endswith(f"Resuming at step 10 {expected}"), said
  versions = read_code_versions(workdir)
  assert versions[-1]["step"] == 10 and versions[-2]["commit"] == "0" * 40, versions


class _FakeCheckpointer:
  def __init__(self, steps: list[int]):
    self.steps, self.directory, self.moved = list(steps), Path("/ckpt"), []

  def wait(self) -> None:
    pass

  def committed_steps(self) -> list[int]:
    return list(self.steps)

  def set_aside(self, steps: list[int], folder: str) -> Path:
    self.moved += steps
    self.steps = [s for s in self.steps if s not in steps]
    return Path("/") / folder


def test_guard_sets_aside_the_checkpoint_that_produced_a_bad_loss():
  from diff_transformer.training.guard import DivergenceGuard
  from diff_transformer.mesh import TrainError
  fake = _FakeCheckpointer([4, 5, 6])
  guard = DivergenceGuard(fake)
  guard.check_step(6, dict(loss=3.0, grad_norm=1.0))
  with pytest.raises(TrainError, match="step 7: loss nan.*last good checkpoint \\(step 5\\)"):
    guard.check_step(7, dict(loss=float("nan"), grad_norm=1.0))  # computed from state 6
  assert fake.moved == [6]


@pytest.mark.parametrize("step, cause", [(1, "the data or the initial state is the likely cause"),
                                         (7, "lower train.lr or raise train.warmup_steps")])
def test_guard_names_the_likely_cause(step, cause):
  """Step 1's loss comes from the initial state at warmup's smallest lr: a non-finite value there
  points at the data or the init; later, at the lr schedule."""
  from diff_transformer.training.guard import DivergenceGuard
  from diff_transformer.mesh import TrainError
  with pytest.raises(TrainError, match=cause) as e:
    DivergenceGuard(_FakeCheckpointer([])).check_step(step, dict(loss=float("nan"), grad_norm=1.0))
  assert "\n" not in str(e.value)
  if step == 1:
    assert "lower train.lr" not in str(e.value)


def test_guard_loss_spike_is_off_by_default_and_bounded_when_set():
  from diff_transformer.training.guard import DivergenceGuard
  from diff_transformer.mesh import TrainError
  calm = DivergenceGuard(_FakeCheckpointer([]))
  for step, loss in enumerate([5.0, 5.0, 50.0], 1):
    calm.check_step(step, dict(loss=loss, grad_norm=1.0))
  fake = _FakeCheckpointer([1, 2, 3])
  bounded = DivergenceGuard(fake, max_loss_spike=3.0)
  for step, loss in enumerate([5.0, 4.0, 4.5], 1):
    bounded.check_step(step, dict(loss=loss, grad_norm=1.0))
  with pytest.raises(TrainError, match="max_loss_spike = 3"):
    bounded.check_step(4, dict(loss=50.0, grad_norm=1.0))
  assert fake.moved == [3] and fake.steps == [1, 2]
  with pytest.raises(TrainError, match="step 2: the updated state's loss inf is not finite"):
    DivergenceGuard(_FakeCheckpointer([1, 2])).check_state(2, float("inf"))


def test_failed_async_save_stops_the_run_in_one_line(corpus, reference, tmp_path, monkeypatch):
  import errno  # the fault's pieces, this test's alone
  import time
  import orbax.checkpoint as ocp
  from orbax.checkpoint._src.path import atomicity
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  finalize = atomicity.AtomicRenameTemporaryPath.finalize

  async def failing_finalize(self, *args, **kwargs):  # a write error in step 75's commit
    if self.get_final().name == "75":
      raise OSError(errno.ENOSPC, "No space left on device", str(self.get()))
    return await finalize(self, *args, **kwargs)

  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", failing_finalize)
  in_progress = ocp.CheckpointManager.is_saving_in_progress

  def settled(self):  # the step's poll sees the save's outcome, however slow this host's writes
    deadline = time.monotonic() + 120
    while in_progress(self) and time.monotonic() < deadline:
      time.sleep(0.01)
    return in_progress(self)

  monkeypatch.setattr(ocp.CheckpointManager, "is_saving_in_progress", settled)
  refused_here(workdir, corpus, ("checkpoint step 75 could not be saved", "No space left",
                                 "newest checkpoint is step 10"),
               **{"train.steps": 160, "train.checkpoint_every": 75, "train.eval_every": 1000})
  # Stopped at the first step's poll after the save thread failed, not at the next save (150).
  assert 75 <= logged_step(workdir) <= 77
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["10", "6", "9"]
  _, _, step = restore_model(workdir)
  assert step == 10


def test_full_file_system_refuses_the_save_in_one_line(corpus, tmp_path):
  fs = tmp_path / "small"
  if not _mount_tmpfs(fs, "size=512k"):
    pytest.skip("mounting a small tmpfs needs root")
  try:
    refused_here(fs / "run", corpus, ("checkpoint step 3", "MB free", "no checkpoint"),
                 **{"train.steps": 4})
    assert list((fs / "run" / "checkpoints").iterdir()) == []  # no partial directory
  finally:
    _umount(fs)


def test_second_writer_is_refused_and_a_stale_lock_recovered(corpus, tmp_path):
  from diff_transformer.mesh import TrainError
  from diff_transformer.runs.lock import WorkdirLock
  workdir = tmp_path / "run"
  workdir.mkdir()
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys; from pathlib import Path; "
       "from diff_transformer.runs.lock import WorkdirLock; "
       f"lock = WorkdirLock(Path({str(workdir)!r})); lock.acquire(); print('locked', flush=True); "
       "sys.stdin.read()"], cwd=ROOT, env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
      text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    refused_here(workdir, corpus, ("another training run holds it", f"pid {holder.pid}"))
    assert not (workdir / "checkpoints").exists()
    with pytest.raises(TrainError, match="another training run"):
      WorkdirLock(workdir).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
  finally:
    if holder.poll() is None:
      holder.kill()
  lock = WorkdirLock(workdir)
  notice = lock.acquire()  # the dead run's lock is stale: taken over
  assert notice is not None and f"pid {holder.pid}" in notice
  lock.release()
  assert WorkdirLock(workdir).acquire() is None  # released cleanly: nothing stale


def test_second_interrupt_exits_at_once_in_one_line(reference, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(reference, workdir)
  script = ("import signal; from pathlib import Path; "
            "from diff_transformer.runs.checkpoint import Checkpointer; "
            "from diff_transformer.training.stop import StopSignal, exit_now; "
            f"ckpt = Checkpointer(Path({str(workdir)!r})); "
            "stop = StopSignal(lambda: exit_now(ckpt, None)); "
            "signal.raise_signal(signal.SIGINT); assert stop.requested == 'SIGINT'; "
            "signal.raise_signal(signal.SIGINT); print('not reached')")
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env(),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 130 and "not reached" not in proc.stdout, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert "abandoned" in lines[0] and f"newest checkpoint is step 10 in {workdir}" in lines[0]


# ---- bad input: one line, exit 2, no traceback -----------------------------------------------
def test_missing_config_file(tmp_path):
  proc = run_program("train.py", "--config=no_such_config.py", "--dry_run", cwd=tmp_path)
  assert_single_stderr_line(proc, "--config: no such file no_such_config.py", str(tmp_path))


def test_default_config_found_from_another_directory(tmp_path):
  proc = run_program("train.py", "--dry_run", cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1])["variant"] == "diff"


def test_unknown_config_key_is_plain_with_the_suggestion():
  proc = run_program("train.py", "--dry_run", "--config.train.stepz=3")
  line = assert_single_stderr_line(proc, "unknown config key 'stepz'",
                                   'Did you mean "steps" instead of "stepz"?')
  assert "\\" not in line


def test_damaged_config_json_in_workdir(corpus, tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text('{"model": {"variant": ')
  refused_here(workdir, corpus, (f"{workdir / 'config.json'}: damaged JSON", "line 1"))
  assert (workdir / "config.json").read_text() == '{"model": {"variant": '  # left as it was


def test_damaged_metadata_json_in_data_dir(corpus, tmp_path):
  data = tmp_path / "data"
  shutil.copytree(corpus, data)
  (data / "metadata.json").write_text("{not json")
  refused_here(tmp_path / "run", data, (f"{data / 'metadata.json'}: damaged JSON",))


def test_workdir_that_is_a_file(corpus, tmp_path):
  path = tmp_path / "a_file"
  path.write_text("keep me")
  # Refused before the data is looked at.
  refused_here(path, tmp_path / "no_such_data", (f"--workdir {path}: is a file",))
  assert path.read_text() == "keep me"


def test_read_only_workdir(corpus, tmp_path):
  ro = tmp_path / "ro"
  if os.geteuid() != 0:
    ro.mkdir()
    ro.chmod(0o555)
  elif not _mount_tmpfs(ro, "ro,size=64k"):
    pytest.skip("a read-only directory needs chmod (non-root) or a read-only mount (root)")
  try:
    refused_here(ro / "run", corpus, (f"--workdir {ro / 'run'}: cannot write there",))
  finally:
    if os.geteuid() == 0:
      _umount(ro)


PROGRAM_FAULTS = [  # (program, arguments, what the one line says); {tmp}: the test's folder
    ("train.py", ["--config.model.num_heads=3", "--dry_run"], "model.head_dim"),
    ("eval.py", ["--workdir={tmp}/nothing"], "{tmp}/nothing"),
    ("eval.py", ["--workdir={tmp}/nothing", "--suites=generate", "--max_new_tokens=-3"],
     "--max_new_tokens: must be a positive number of tokens, got -3"),
    ("study.py", ["--quick", "--seeds=0,x", "--root={tmp}/s"], "--seeds: '0,x' is not"),
    ("sweep.py", ["--sweep={tmp}/bad_sweep.py", "--root={tmp}/r"],
     "--sweep: {tmp}/bad_sweep.py:2:"),
    # the workdir and the variant are checked before the hf extra is asked for
    ("export.py", ["--workdir={tmp}/nothing", "--out={tmp}/hf"], "{tmp}/nothing"),
    ("aot_compile.py", ["--topology=v5e_2x2"], "--topology: 'v5e_2x2' is neither a TPU topology"),
    ("prepare_data.py", ["--input", "{tmp}/nope.txt", "--output", "{tmp}/out"],
     "nope.txt: no such file or directory"),
    ("-m diff_transformer.lm_eval", ["--model_args", "workdir={tmp}/nothing", "--tasks", "piqa"],
     "not a training workdir"),
]


@pytest.mark.parametrize("program, args, message", PROGRAM_FAULTS,
                         ids=[p[0] for p in PROGRAM_FAULTS])
def test_every_program_ends_bad_input_in_one_line(tmp_path, program, args, message):
  """Each entry point: the whole of stderr is one `error:` line, exit status 2, no traceback."""
  (tmp_path / "bad_sweep.py").write_text(
      "from diff_transformer.sweeps.definition import Sweep\nSWEEP = Sweep(\n")
  args = [a.format(tmp=tmp_path) for a in args]
  if program.startswith("-m "):
    proc = subprocess.run([sys.executable, *program.split(), *args], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=300)
  else:
    proc = run_program(program, *args)
  assert_single_stderr_line(proc, message.format(tmp=tmp_path))


OUTPUT_FAULTS = [  # every program's output path under a regular file: one line, exit 2
    ("train.py", ["--workdir={bad}/w"], "--workdir {bad}/w: cannot write there"),
    ("eval.py", ["--compare", "--compare_dir={bad}/c", "{tmp}/a", "{tmp}/b"],
     "--compare_dir {bad}/c: cannot write there"),
    ("study.py", ["--quick", "--root={bad}/r"], "--root {bad}/r: cannot write there"),
    ("study.py", ["--quick", "--root={tmp}/r", "--results={bad}/s"], "--results {bad}/s: cannot"),
    ("sweep.py", ["--sweep=configs/sweeps/cpu.py", "--root={bad}/r"], "--root {bad}/r: cannot"),
    ("export.py", ["--workdir={tmp}/nothing", "--out={bad}/hf"], "--out {bad}/hf: {bad} is a file"),
    ("prepare_data.py", ["--input", "{tmp}/nope.txt", "--output", "{bad}/out"],
     "--output {bad}/out: {bad} is a file"),
    ("aot_compile.py", ["--out={bad}/a.json"], "--out {bad}: is a file, not a directory"),
]


@pytest.mark.parametrize("program, args, message", OUTPUT_FAULTS,
                         ids=[f"{p[0]}:{p[1][-1]}" for p in OUTPUT_FAULTS])
def test_every_program_refuses_an_impossible_output_path_in_one_line(tmp_path, program, args,
                                                                     message):
  bad = tmp_path / "file"
  bad.write_text("a file, so nothing can be created under it")
  args = [a.format(tmp=tmp_path, bad=bad) for a in args]
  proc = run_program(program, *args)
  assert_single_stderr_line(proc, message.format(tmp=tmp_path, bad=bad))
  assert bad.read_text().startswith("a file")  # untouched
  assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*.json"))


@pytest.mark.parametrize("args, message", [
    ("workdir={run},stepz=3", "--model_args: unknown key 'stepz'"),
    ("workdir={tmp}/nothing", "not a training workdir"),
    ("workdir={task_run}", "trained on the synthetic task 'mqar'"),
    ("workdir={run},step=7", "--model_args step=7: {run} has checkpoints at steps [4, 8]"),
])
def test_lm_eval_adapter_refuses_what_it_cannot_serve_in_one_line(tmp_path, args, message):
  """Checked before lm-eval starts (and without lm-eval installed); a run of each kind is a
  config.json and checkpoint folders, all the check reads."""
  from diff_transformer.lm_eval.__main__ import check_model_args
  for name, data in (("run", "shakespeare"), ("task_run", "mqar")):
    (tmp_path / name / "checkpoints" / "4").mkdir(parents=True)
    (tmp_path / name / "checkpoints" / "8").mkdir()
    (tmp_path / name / "config.json").write_text(
        json.dumps(dict(model={}, data=dict(name=data), train={})))
  paths = dict(run=tmp_path / "run", task_run=tmp_path / "task_run", tmp=tmp_path)
  with pytest.raises(ValueError) as e:
    check_model_args(["--model_args", args.format(**paths), "--tasks", "piqa"])
  assert message.format(**paths) in str(e.value) and "\n" not in str(e.value)
  check_model_args([f"--model_args=workdir={paths['run']},step=8,batch_size=4"])  # servable


def test_a_reader_during_training_gets_a_committed_step_or_one_line(corpus, tmp_path):
  """eval.py's restore, over and over while train.py checkpoints every step and keeps two: each
  read is a committed step, or a one-line refusal; never a half-written checkpoint."""
  workdir = tmp_path / "run"
  flags = tiny_flags(corpus, **{"train.steps": 20, "train.checkpoint_every": 1,
                                "train.max_to_keep": 2, "train.eval_every": 100})
  proc = subprocess.Popen(train_cmd(workdir, flags), cwd=ROOT, env=env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  wait_for(lambda: list(workdir.glob("checkpoints/[0-9]*")), proc)
  read, refused = [], []
  while proc.poll() is None:
    try:
      read.append(restore_model(workdir)[2])
    except UserError as e:
      refused.append(message_lines(e))
  assert proc.returncode == 0, proc.stderr.read()[-3000:]
  assert read, "no read landed while the run trained"
  assert all(len(lines) == 1 for lines in refused), refused
  assert restore_model(workdir)[2] == 20 and read == sorted(read)
