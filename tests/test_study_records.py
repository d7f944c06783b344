"""Study records and provenance under damage: damaged records are named and rebuilt, a rebuild
keeps the training provenance, refusals name the real holder and flag, files are published
atomically, untracked code makes a checkout dirty, export names what a synthetic run lacks."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from configs import synthetic as synthetic_configs
from diff_transformer import cli, launch, paths, provenance
from diff_transformer.runs import folder as run_folder
from diff_transformer.errors import UserError
from diff_transformer.study import invocations, records
from diff_transformer.runs.record import setting
from diff_transformer.interop.export import export_run
from diff_transformer.runs.lock import WorkdirLock
from tests.helpers.studies import TINY_STUDY

ROOT = Path(__file__).resolve().parents[1]
DAMAGE = {  # what a damaged record holds -> the words of its warning
    "not_utf8": (b"\xff\xfe\x00{", "not UTF-8 text (byte 0)"),
    "nested_too_deep": (b"[" * 100_000 + b"]" * 100_000,
                        "damaged JSON (nested too deeply to read)"),
    "huge_integer": (b'{"seed": ' + b"7" * 5000 + b"}", "damaged JSON (Exceeds the limit"),
    "not_an_object": (b"[1, 2, 3]", "a JSON list, not a record"),
    "keys_missing": (b'{"point": "p"}', "missing setting, variant, seed"),
}


def _config():
  return synthetic_configs.get_config("transformer-mqar_plain")


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("grid", [False, True])
def test_a_damaged_record_is_named_and_kept_aside_when_rebuilt(tmp_path, capsys, damage, grid):
  config = _config()
  fields = dict(lr=1e-3, seed=0) if grid else dict(variant="transformer", seed=0)
  records.write(tmp_path, "p", fields, setting(config), grid=grid)
  assert records.read(tmp_path, "p", setting(config), grid=grid)["seed"] == 0
  content, words = DAMAGE[damage]
  if grid and damage == "keys_missing":
    words = "missing setting, lr, seed"
  target = records.path(tmp_path, "p", grid)
  target.write_bytes(content)
  # retrained or rebuilt, never trusted
  assert records.read(tmp_path, "p", setting(config), grid=grid) is None
  out = capsys.readouterr().out
  assert f"warning: {target}: damaged record ({words}" in out and out.count("\n") == 1
  records.write(tmp_path, "p", fields, setting(config), grid=grid)  # the rebuilt record
  assert records.read(tmp_path, "p", setting(config), grid=grid)["seed"] == 0
  kept = list(target.parent.glob("p.json.damaged-*"))
  assert len(kept) == 1 and kept[0].read_bytes() == content  # nothing saved is lost


def test_report_only_on_damaged_records_keeps_the_provenance_and_names_its_rebuild(tmp_path):
  """No traceback on damaged records; invocations.jsonl and the training command and machine in
  study.json stay as they were; the rebuild is named apart, in study.json and report.md."""
  file = tmp_path / "tiny_study.py"
  file.write_text(TINY_STUDY)
  study = cli.load_definition(str(file), "study", "STUDY").validate().quick()
  results = tmp_path / "results"
  for i, point in enumerate(study.points()):
    path = records.path(results, point)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(list(DAMAGE.values())[i % 3][0])
  invocations = '{"command": "python study.py --study=x", "wall_seconds": 60.0, "trained": 4}\n'
  (results / "invocations.jsonl").write_text(invocations)
  (results / "study.json").write_text(json.dumps(dict(study=dict(
      command="python study.py --study=x", wall_seconds=60.0, machine="the training machine"))))
  env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run([sys.executable, "study.py", f"--study={file}", "--quick",
                         f"--results={results}", f"--root={tmp_path / 'root'}", "--report_only"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stdout.count("damaged record") == len(study.points()), proc.stdout[-2000:]
  # no grid record: the grid's first round and every compared run (waiting for its lr) are left
  assert ("Left to train: 4 grid runs in the grid's next round (more where a grid grows) and 4 "
          "compared runs.") in proc.stdout, proc.stdout[-2000:]
  assert (results / "invocations.jsonl").read_text() == invocations
  info = json.loads((results / "study.json").read_text())["study"]
  assert info["machine"] == "the training machine"
  assert info["command"] == "python study.py --study=x" and info["wall_seconds"] == 60.0
  assert "--report_only" in info["rebuilt"]["command"] and info["rebuilt"]["machine"]
  assert "This report was rebuilt from the run records" in (results / "report.md").read_text()


def test_a_stopped_part_counts_the_finished_runs_it_recorded(tmp_path):
  import time
  setting, since = dict(x=1), time.time()
  records.write(tmp_path, "diff-s0", dict(variant="diff", seed=0), setting)
  os.utime(records.path(tmp_path, "diff-s0"), (since - 60, since - 60))  # an earlier part's
  records.write(tmp_path, "diff-s1", dict(variant="diff", seed=1), setting)
  records.write(tmp_path, "diff-lr0.001-s1000", dict(lr=1e-3, seed=1000), setting, grid=True)
  records.write(tmp_path, "diff-s2", dict(variant="diff", seed=2, failed="diverged"), setting)
  records.write(tmp_path, "diff-s3", dict(variant="diff", seed=3, reused_from="other/diff-s3"),
                setting)
  assert records.trained_since(tmp_path, since) == 2  # neither a failure nor a reused record
  assert records.trained_since(tmp_path, time.time() + 1) == 0


def test_what_is_left_to_train_is_timed_at_the_median_run_of_its_own_shape():
  from configs.studies import lm_tuned
  from diff_transformer.study import runner
  status = {"diff@scale0.1-lr0.00119-s1000": runner.REPORT_ONLY,
            "diff@scale0.1-lr0.00178-s1000": "recorded", "diff@tuned-s0": runner.WAITING,
            "transformer@1-s0": runner.REPORT_ONLY, "diff@L4@tuned-s0": runner.WAITING}
  two, four = (runner.point_setting(lm_tuned.STUDY, p)
               for p in ("diff@tuned-s1", "diff@L4@tuned-s1"))
  recorded = [dict(train_seconds=t, setting=two) for t in (300.0, 600.0, 900.0)]
  shape = "d_model=128 num_layers={} seq_len=256 steps=1000"
  assert runner.left_to_train(lm_tuned.STUDY, status, recorded, jobs=2) == (
      "Left to train: 1 grid run in the grid's next round (more where a grid grows) and 3 "
      f"compared runs; at the recorded median per shape, 10.0 min a run (3 at {shape.format(2)})"
      ": about 0.5 h of run time (0.2 h at --jobs=2), and 1 run of a shape no record has timed.")
  recorded += [dict(train_seconds=1500.0, setting=four), dict(train_seconds=math.nan, setting=four)]
  assert runner.left_to_train(lm_tuned.STUDY, status, recorded, jobs=2).endswith(
      f"10.0 min a run (3 at {shape.format(2)}), 25.0 min a run (1 at {shape.format(4)}): about "
      "0.9 h of run time (0.5 h at --jobs=2).")
  assert runner.left_to_train(lm_tuned.STUDY, status, [], jobs=2).endswith("3 compared runs.")


def test_a_refusal_names_the_real_holder_and_flag(tmp_path):
  root, results = tmp_path / "root", tmp_path / "results"
  root.mkdir(), results.mkdir()
  with launch.holding(root, "study.py"):
    with pytest.raises(UserError,
                       match=rf"^--root {re.escape(str(root))}: another study\.py holds it "
                             rf"\(pid {os.getpid()} "):
      with launch.holding(root, "sweep.py"):
        pass
  with launch.holding(results, "sweep.py"):  # a study.py whose --results another program holds
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    file = tmp_path / "tiny_study.py"
    file.write_text(TINY_STUDY)
    proc = subprocess.run([sys.executable, "study.py", f"--study={file}", "--quick",
                           f"--root={root}", f"--results={results}", "--report_only"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
  assert f"--results {results}: another sweep.py holds it (pid {os.getpid()}" in proc.stderr
  # a training run's workdir lock names no program: the refusal says what holds it in words
  lock = WorkdirLock(tmp_path / "run")
  (tmp_path / "run").mkdir()
  lock.acquire()
  with pytest.raises(UserError, match="another training run holds it"):
    WorkdirLock(tmp_path / "run").acquire()
  lock.release()


def test_writes_are_atomic_and_a_refused_write_is_one_line(tmp_path, monkeypatch):
  target = tmp_path / "study.json"
  paths.write_atomic(target, "old")

  def killed(*_):  # a kill (or a full disk) between writing the temp file and the rename
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(os, "replace", killed)
  with pytest.raises(UserError, match=rf"^{re.escape(str(target))}: could not be written "
                                      r"\(No space left on device\); the previous version, if "
                                      "any, is unchanged$"):
    paths.write_atomic(target, "new and longer")
  monkeypatch.undo()
  assert target.read_text() == "old"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["study.json"]


def test_untracked_code_makes_the_checkout_dirty_and_is_listed(tmp_path):
  git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t",
                                   "-c", "user.email=t@t", *a], check=True, capture_output=True)
  git("init", "-q")
  (tmp_path / "train.py").write_text("")
  (tmp_path / "records").mkdir()
  (tmp_path / "records" / "run-s0.json").write_text("{}")
  git("add", "train.py", "records")
  git("commit", "-q", "-m", "x")
  assert provenance.code_version(tmp_path)["dirty"] is False
  (tmp_path / "records" / "run-s0.json").write_text('{"retrained": true}')  # a study's record
  provenance.code_version.cache_clear()
  assert provenance.code_version(tmp_path)["dirty"] is False
  (tmp_path / "train.py").write_text("# changed")
  provenance.code_version.cache_clear()
  assert provenance.code_version(tmp_path)["dirty"] is True
  git("checkout", "-q", "--", "train.py")
  (tmp_path / "diff_transformer").mkdir()
  (tmp_path / "diff_transformer" / "new_module.py").write_text("")
  (tmp_path / "notes.txt").write_text("")  # not code: does not count
  provenance.code_version.cache_clear()
  version = provenance.code_version(tmp_path)
  assert version["dirty"] is True and version["untracked"] == ["diff_transformer/new_module.py"]
  assert provenance.label(version).split(",")[0].endswith("+uncommitted")
  provenance.code_version.cache_clear()


def test_export_of_a_synthetic_task_run_says_what_it_lacks(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  config = _config()
  config.model.short_conv = 0  # (a short convolution is refused first: no HF class has one)
  run_folder.RunFolder(workdir).config.write_text(config.to_json())
  (workdir / run_folder.TOKENIZER_RECORD).write_text('{"name": "synthetic", "vocab_size": 264}')
  w = re.escape(str(workdir))
  with pytest.raises(UserError, match=rf"^--workdir {w}: trained on the synthetic task "
                                      "'mqar', which has no text tokenizer; evaluate it with "
                                      rf"`python eval\.py --workdir {w}`$"):
    export_run(workdir, tmp_path / "out")


WRITER = """
import sys
from diff_transformer.paths import write_atomic
for i in range(10**6):
  write_atomic(sys.argv[1], str(i % 10) * 4_000_000)
  print(i, flush=True)
"""


def test_a_write_killed_midway_leaves_a_whole_file(tmp_path):
  """SIGKILL to a process that keeps rewriting a 4 MB file: what is there afterwards is one whole
  version (one digit, full length), never a mix or a truncated one."""
  target = tmp_path / "study.json"
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], env=env,
                          stdout=subprocess.PIPE, text=True)
  for _ in range(3):  # a few whole writes first, so the kill lands between or inside later ones
    proc.stdout.readline()
  proc.kill()
  proc.wait()
  text = target.read_text()
  assert len(text) == 4_000_000 and len(set(text)) == 1


def test_a_refused_record_write_keeps_the_records_before_it(tmp_path, monkeypatch):
  """A full disk while a driver writes a record: one line naming the file; the records already
  written stay readable (the driver stops there: launch.run stops its children and re-raises)."""
  config = _config()
  records.write(tmp_path, "a", dict(variant="transformer", seed=0), setting(config))
  real = Path.write_text

  def full(self, *args, **kwargs):
    if ".tmp-" in self.name:
      raise OSError(28, "No space left on device")
    return real(self, *args, **kwargs)

  monkeypatch.setattr(Path, "write_text", full)
  with pytest.raises(UserError, match="could not be written \\(No space left on device\\)"):
    records.write(tmp_path, "b", dict(variant="transformer", seed=1), setting(config))
  monkeypatch.undo()
  assert records.read(tmp_path, "a", setting(config))["seed"] == 0
  assert not records.path(tmp_path, "b").exists()
  assert not list(records.path(tmp_path, "b").parent.glob(".*tmp*"))


def test_settings_compare_with_todays_defaults_removed(monkeypatch):
  """An option added with its default leaves every committed record matching (no table of added
  options); a changed default, or a record naming a key away from it, is a difference naming
  the key."""
  from diff_transformer.runs import record as run_record
  from configs.studies import lm_table6
  committed = ROOT / "docs" / "results" / "study_lm_table6" / "records"
  recorded = json.loads((committed / "diff-s0.json").read_text())
  expected = setting(lm_table6.STUDY.resolved_config("diff-s0", recorded["lr"]))
  assert run_record.differences(expected, recorded["setting"]) == []
  today = run_record.defaults()
  added = dict(today, **{"model.new_knob": 1.5})  # an option added later, at its default
  monkeypatch.setattr(run_record, "defaults", lambda: added)
  assert run_record.differences(dict(expected, **{"model.new_knob": 1.5}),
                                recorded["setting"]) == []
  assert run_record.differences(dict(expected, **{"model.new_knob": 2.0}), recorded["setting"]
                                ) == [("model.new_knob", 1.5, 2.0)]
  changed = dict(today, **{"model.diff.subln": False})  # a default changed: old records differ
  monkeypatch.setattr(run_record, "defaults", lambda: changed)
  assert run_record.differences({k: v for k, v in expected.items() if k != "model.diff.subln"},
                                recorded["setting"]) == [("model.diff.subln", True, False)]


def test_a_variant_registered_later_orphans_no_record():
  """A `module:Class` variant registered after today's defaults were first read (as in a driver
  that loads a study naming one) adds its own key at its default: every committed record still
  matches its point."""
  from diff_transformer.model.attention import unregister_variant, variant_class
  from diff_transformer.runs import record as run_record
  from configs.studies import lm_table6
  from tests.helpers.toy_variant import FIXED_LAMBDA, TOY_PATH
  recorded = json.loads((ROOT / "docs/results/study_lm_table6/records/diff-s0.json").read_text())
  run_record.defaults()
  variant_class(TOY_PATH)
  try:
    expected = setting(lm_table6.STUDY.resolved_config("diff-s0", recorded["lr"]))
    assert not any("fixed_lambda" in key for key in expected)  # not this run's variant
    assert FIXED_LAMBDA == variant_class(TOY_PATH).Options().fixed_lambda
    assert run_record.differences(expected, recorded["setting"]) == []
  finally:
    unregister_variant(TOY_PATH)


@pytest.mark.parametrize("name", ["lm", "lm_table6", "lm_scale", "lm_tuned", "retrieval"])
def test_committed_studies_rebuild_from_their_records_unchanged(tmp_path, name):
  """Every committed record still matches its point's setting (an option added to the config
  later must not orphan them), and study.json and report.md rebuild from them byte for byte,
  apart from the note that names the rebuild."""
  import shutil
  from diff_transformer.study import runner
  committed = ROOT / "docs" / "results" / f"study_{name}"
  results = tmp_path / name
  shutil.copytree(committed, results)
  study = cli.load_definition(str(ROOT / "configs" / "studies" / f"{name}.py"), "study",
                              "STUDY").validate()
  status, grid = runner.run(study, "", tmp_path / "root", results, train=False)
  assert set(status.values()) == {"recorded"}, status
  origin = invocations.provenance(results, "python study.py --report_only", 0.0, 0, rebuild=True)
  runner.write_results(study, results, grid, origin)  # the writing study.py does
  rebuilt, before = (json.loads((d / "study.json").read_text()) for d in (results, committed))
  assert rebuilt["study"].pop("rebuilt")["command"] == "python study.py --report_only"
  before["study"].pop("rebuilt", None)  # a committed rebuild names its own
  assert rebuilt == before

  def report(folder):
    return [line for line in (folder / "report.md").read_text().splitlines()
            if not line.startswith("This report was rebuilt from the run records")]
  assert report(results) == report(committed)
  log = "invocations.jsonl"
  assert (results / log).read_bytes() == (committed / log).read_bytes()


def test_a_grid_run_that_failed_before_its_first_step_is_no_result_of_the_grid(tmp_path):
  """A diverged grid run is recorded as a failed lr; one that never trained a step (a broken
  install, a missing module) is left unrecorded, so the grid does not lose that lr."""
  from diff_transformer.study.points import trained_a_step
  started = tmp_path / "started"
  started.mkdir()
  assert not trained_a_step(started) and not trained_a_step(tmp_path / "never")
  folder = run_folder.RunFolder(started)
  folder.metrics.write_text(json.dumps(dict(step=0, kind="val", val_loss=5.0)) + "\n")
  assert not trained_a_step(started)
  with folder.metrics.open("a") as f:
    f.write(json.dumps(dict(step=1, kind="train", loss=float("nan"))) + "\n")
  assert trained_a_step(started)


def test_a_record_under_another_setting_is_named_with_its_key_and_kept(tmp_path, capsys):
  """--report_only (and any continuation: the line comes before training starts) names each
  record it does not reuse, with the key and both values, an unknown key included; the records
  stay on disk untouched."""
  import shutil
  from diff_transformer.study import runner
  results = tmp_path / "lm_table6"
  shutil.copytree(ROOT / "docs" / "results" / "study_lm_table6", results)
  changed = results / "records" / "diff-s0.json"
  unknown = results / "records" / "transformer-s1.json"
  for path, key, value in ((changed, "train.grad_clip", 0.5), (unknown, "train.mystery", 3)):
    record = json.loads(path.read_text())
    record["setting"][key] = value
    path.write_text(json.dumps(record))
  before = {p: p.read_bytes() for p in (changed, unknown)}
  study = cli.load_definition(str(ROOT / "configs" / "studies" / "lm_table6.py"), "study",
                              "STUDY").validate()
  status, _ = runner.run(study, "", tmp_path / "root", results, train=False)
  out = capsys.readouterr().out
  assert status["diff-s0"] == status["transformer-s1"] == "not run (report only)"
  assert (f"diff-s0: {changed} was trained under another setting (train.grad_clip 0.5 -> 1.0); "
          "not reused, left out of the report") in out, out
  assert f"{unknown} was trained under another setting (train.mystery 3 -> None)" in out, out
  assert {p: p.read_bytes() for p in before} == before
