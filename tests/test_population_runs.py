"""Population training end to end (training/population_loop.py, train.py --population): each
member writes the run its standalone train.py writes (losses, evaluations, checkpoints,
summary), a diverging member is named and the others finish, and a killed population resumes
exactly."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diff_transformer.runs.folder import RunFolder
from tests.helpers.runs import (ROOT, STEPS, env, logged_step, losses, tiny_flags, train_here,
                                val_losses, wait_for)

DEFAULT_FINAL_RATIO = 2e-4 / 3e-3  # configs/default.py's final_lr over tiny_flags' lr
# (name, seed, lr): the reference run's own member, another seed at another lr, a third lr, and
# one whose lr makes it diverge at once.
MEMBERS = (("ref", 0, 3e-3), ("s1", 1, 4.5e-3), ("slow", 0, 1.5e-3), ("nan", 0, 1e30))


def _overrides(seed: int, lr: float) -> dict:
  return {"train.seed": seed, "data.seed": seed, "train.lr": lr,
          "train.final_lr": lr * DEFAULT_FINAL_RATIO}


def _members_file(corpus: Path, root: Path, members=MEMBERS) -> Path:
  listing = dict(name="tiny", members=[
      dict(point=name, args=[f"--config={ROOT / 'configs/default.py'}",
                             f"--workdir={root / name}",
                             *tiny_flags(corpus, **_overrides(seed, lr))])
      for name, seed, lr in members])
  root.mkdir(parents=True, exist_ok=True)
  path = root / "tiny.json"
  path.write_text(json.dumps(listing))
  return path


def _train_population(path: Path) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, str(ROOT / "train.py"), f"--population={path}"],
                          cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


@pytest.fixture(scope="module")
def population(corpus, tmp_path_factory) -> Path:
  """An uninterrupted population of MEMBERS (its members' folders under the returned root)."""
  root = tmp_path_factory.mktemp("population")
  proc = _train_population(_members_file(corpus, root))
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 1, err[-3000:]  # the diverging member fails the program
  assert err.strip().splitlines()[-1] == ("error: population: members nan failed; each one's "
                                          "log says why"), err[-3000:]
  return root


def _assert_close_runs(got: Path, want: Path) -> None:
  g, w = losses(got), losses(want)
  assert sorted(g) == sorted(w) == list(range(1, STEPS + 1))
  np.testing.assert_allclose([g[s][-1] for s in sorted(g)], [w[s][-1] for s in sorted(w)],
                             rtol=2e-5)
  gv, wv = val_losses(got), val_losses(want)
  assert sorted(gv) == sorted(wv)
  np.testing.assert_allclose(list(gv.values()), list(wv.values()), rtol=2e-5)


def test_each_member_is_its_standalone_run(population, corpus, reference, tmp_path):
  """The reference run's member, and one at another seed and lr: each one's loss curve,
  validation losses, checkpoints and summary are its standalone run's, to float32
  reduction-order differences (the third lr's member is checked against itself, resumed, in
  the kill test below)."""
  _assert_close_runs(population / "ref", reference)
  for name, seed, lr in MEMBERS[1:2]:
    alone = tmp_path / name
    train_here(alone, corpus, **_overrides(seed, lr))
    _assert_close_runs(population / name, alone)
    member, standalone = RunFolder(population / name), RunFolder(alone)
    assert member.checkpoint_steps() == standalone.checkpoint_steps() == [6, 9, 10]
    got, want = member.read_summary(), standalone.read_summary()
    assert got["population"] == dict(name="tiny", member=MEMBERS.index((name, seed, lr)),
                                     members=len(MEMBERS))
    assert set(got) - set(want) == {"population"}
    assert json.loads(member.config.read_text()) == json.loads(standalone.config.read_text())


def test_a_diverging_member_is_named_and_the_others_finish(population):
  failed = RunFolder(population / "nan")
  assert failed.read_summary() is None  # not a finished run: a study records it as failed
  last = failed.log.read_text().strip().splitlines()[-1]
  assert last.startswith("error: step ") and "is not finite" in last, last
  assert all(RunFolder(population / name).read_summary() for name, *_ in MEMBERS[:3])


def _stop(proc: subprocess.Popen, sig: signal.Signals, ready) -> None:
  try:
    wait_for(ready, proc)
    proc.send_signal(sig)
    proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()


def test_a_killed_population_resumes_exactly(population, corpus, tmp_path):
  """Stopped by SIGTERM (every member saves), resumed, then killed by SIGKILL (the newest step
  every member holds is where it resumes), the rerun continues every member bit for bit."""
  root = tmp_path / "killed"
  path = _members_file(corpus, root)
  _stop(_train_population(path), signal.SIGTERM, lambda: logged_step(root / "ref") >= 4)
  stopped_at = logged_step(root / "ref")
  assert stopped_at < STEPS and all(RunFolder(root / n).checkpoint_steps()[-1] == stopped_at
                                    for n, *_ in MEMBERS[:3])
  saved_6 = lambda: RunFolder(root / "slow").checkpoint_steps()[-1] == 6  # noqa: E731
  _stop(_train_population(path), signal.SIGKILL,
        lambda: logged_step(root / "ref") >= 7 and saved_6())
  assert logged_step(root / "ref") < STEPS
  rerun = _train_population(path)
  out, err = rerun.communicate(timeout=600)
  assert rerun.returncode == 1, err[-3000:]  # the diverged member is failed, not retrained
  assert "Resumed 3 training members from checkpoint step" in out, out[-2000:]
  for name, *_ in MEMBERS[:3]:
    got, want = losses(root / name), losses(population / name)
    assert sorted(got) == sorted(want)
    for step, values in got.items():
      assert all(v == want[step][0] for v in values), (name, step, values, want[step])
    assert val_losses(root / name) == val_losses(population / name)


def test_members_saved_at_their_last_step_without_summaries_are_finished_by_a_rerun(
    population, corpus, tmp_path):
  """A population stopped between its last save and its summaries: the rerun evaluates each
  member's saved state and writes its summary, with the uninterrupted run's validation loss."""
  want = {}
  for name, *_ in MEMBERS[:3:2]:
    shutil.copytree(population / name, tmp_path / name)
    want[name] = json.loads((tmp_path / name / "summary.json").read_text())
    (tmp_path / name / "summary.json").unlink()
  rerun = _train_population(_members_file(corpus, tmp_path, MEMBERS[:3:2]))
  out, err = rerun.communicate(timeout=600)
  assert rerun.returncode == 0, err[-3000:]
  for name, summary in want.items():
    got = RunFolder(tmp_path / name).read_summary()
    assert got is not None and got["step"] == summary["step"] == STEPS, (name, got)
    assert got["val_loss"] == pytest.approx(summary["val_loss"], abs=1e-6)
