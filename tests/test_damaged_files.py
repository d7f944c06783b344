"""Damaged input files. Every kind the checked reader knows (diff_transformer/files.py KINDS), and
safetensors weights, is damaged in each way (cut short, random bytes, not UTF-8, the wrong JSON
type, a required key missing or of the wrong type, nesting or an integer the parser itself cannot
hold) and read as the program that reads it does:
one UserError line naming the file, and the folder unchanged. The programs themselves answer
the damaged inputs users met with one `error:` line, exit status 2 and no traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diff_transformer import files
from diff_transformer.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
DAMAGES = ("truncated", "random_bytes", "not_utf8", "wrong_type", "key_missing", "key_wrong_type",
           "deep_nesting", "huge_integer")
_WRONG = {dict: [], list: {}, str: 7, int: "7", float: "7", bool: "yes"}


def _damage(path: Path, how: str, shape: files.Shape | None) -> bool:
  """Damages the file in place; False where the damage does not apply to its kind."""
  data = path.read_bytes()
  if how == "truncated":
    path.write_bytes(data[:len(data) // 2])
  elif how == "random_bytes":
    path.write_bytes(np.random.default_rng(len(data)).bytes(max(len(data), 64)))
  elif how == "not_utf8":
    path.write_bytes(b"\xff\xfe" + data)
  elif shape is None:  # a binary file: only the byte-level damages apply
    return False
  elif how == "deep_nesting":  # deeper than the parser's recursion
    path.write_text("[" * 100_000 + "]" * 100_000)
  elif how == "huge_integer":  # longer than Python converts to an int
    path.write_text('{"x": ' + "7" * 5000 + "}")
  elif how == "wrong_type":
    path.write_text(json.dumps(_WRONG[shape.top]))
  else:
    value = json.loads(data)
    if shape.top is not dict or not shape.keys:
      return False
    key, kind = shape.keys[0]
    if how == "key_missing":
      del value[key]
    else:
      value[key] = _WRONG[kind]
    path.write_text(json.dumps(value))
  return True


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  """One folder of every file kind, each valid: a workdir, an HF export (single file and
  sharded), prepared-data metadata, a members file, tokenizer files, study results."""
  pytest.importorskip("safetensors")
  from diff_transformer.data.tokenizer import BPETokenizer
  from diff_transformer.interop.export import export_run
  from tests.helpers import hf_runs
  root = tmp_path_factory.mktemp("kinds")
  run = hf_runs.make_run(root / "run", hf_runs.run_config("transformer"))
  (run / "summary.json").write_text(json.dumps({"step": 1, "val_loss": 2.0}))
  (run / "code_version.json").write_text(json.dumps([{"step": 0, "commit": None}]))
  (run / "eval").mkdir()
  (run / "eval" / "loss.json").write_text(json.dumps({"step": 1, "loss": 2.0}))
  export_run(run, root / "hf")
  sharded = root / "hf_sharded"
  sharded.mkdir()
  (sharded / "config.json").write_bytes((root / "hf" / "config.json").read_bytes())
  (sharded / "model-00001-of-00001.safetensors").write_bytes(
      (root / "hf" / "model.safetensors").read_bytes())
  from safetensors import safe_open
  with safe_open(str(root / "hf" / "model.safetensors"), framework="numpy") as f:
    names = list(f.keys())
  (sharded / "model.safetensors.index.json").write_text(json.dumps(
      {"weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}))
  (root / "data").mkdir()
  (root / "data" / "metadata.json").write_text(json.dumps({"format": 2}))
  (root / "members.json").write_text(json.dumps(
      {"name": "cell", "members": [{"args": ["--workdir=a"]}]}))
  (root / "tok").mkdir()
  BPETokenizer.train(["abc abd abe " * 50], 300).save(root / "tok" / "tokenizer.json")
  (root / "tok" / "tiktoken.json").write_text(json.dumps({"encoding": "cl100k_base"}))
  (root / "study").mkdir()
  (root / "study" / "study.json").write_text(json.dumps({"study": {"name": "s"}}))
  (root / "peak.json").write_text(json.dumps({"tflops": 0.2, "dtype": "float32"}))
  return root


def _spec():
  from diff_transformer.model.attention import spec_from_config
  from tests.helpers import hf_runs
  return spec_from_config(hf_runs.run_config("transformer").model)


def _tiktoken(folder: Path):
  import ml_collections
  from diff_transformer.data.tokenizer import build_tokenizer
  return build_tokenizer(ml_collections.ConfigDict(dict(tokenizer="tiktoken")), folder)


def _readers():
  """kind -> (file under the base folder, what the program that reads it calls first)."""
  from diff_transformer.data.prepare import read_metadata
  from diff_transformer.data.tokenizer import read_hf_tokenizer
  from diff_transformer.errors import ConfigError
  from diff_transformer.interop.hf_import import check_folder
  from diff_transformer.runs import record
  from diff_transformer.runs.folder import RunFolder
  from diff_transformer.study import invocations
  from diff_transformer.training import peak
  return {
      "run config": ("run/config.json", lambda b: record.read_config(b / "run")),
      "tokenizer record": ("run/tokenizer_record.json",
                           lambda b: record.check_tokenizer_record(b / "run")),
      "code versions": ("run/code_version.json", lambda b: record.read_code_versions(b / "run")),
      "run summary": ("run/summary.json", lambda b: RunFolder(b / "run").read_summary()),
      "eval result": ("run/eval/loss.json", lambda b: RunFolder(b / "run").read_eval("loss")),
      "prepared metadata": ("data/metadata.json", lambda b: read_metadata(b / "data")),
      # train.py --population=FILE reads it thus, before anything else
      "members file": ("members.json",
                       lambda b: files.read_json(b / "members.json", ConfigError, "members file")),
      "HF config": ("hf/config.json", lambda b: check_folder(_spec(), b / "hf")),
      "HF index": ("hf_sharded/model.safetensors.index.json",
                   lambda b: check_folder(_spec(), b / "hf_sharded")),
      "tokenizer file": ("tok/tokenizer.json",
                         lambda b: read_hf_tokenizer(b / "tok" / "tokenizer.json")),
      "tiktoken record": ("tok/tiktoken.json", lambda b: _tiktoken(b / "tok")),
      # a damaged study.json is rewritten by the next study run: read as absent, never an error
      "study results": ("study/study.json", lambda b: invocations._previous_study(b / "study")),
      # a damaged peak cache is measured again: read as absent
      "peak cache": ("peak.json", lambda b: peak._cached_tflops(b / "peak.json")),
      "safetensors": ("hf/model.safetensors", lambda b: check_folder(_spec(), b / "hf")),
  }


TOLERATED = {"study results": {}, "peak cache": None}  # kind -> what a damaged file reads as


def test_the_damage_table_covers_every_kind_the_reader_knows():
  assert set(_readers()) == set(files.KINDS) | {"safetensors"}


def _snapshot(folder: Path) -> dict[str, bytes]:
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
          if p.is_file()}


@pytest.mark.parametrize("kind", sorted(files.KINDS) + ["safetensors"])
def test_every_damaged_file_is_one_line_naming_it_and_nothing_else_changes(base, tmp_path, kind):
  import shutil
  relative, read = _readers()[kind]
  if kind != "tiktoken record":  # a valid tiktoken record needs the tiktoken file beside it
    read(base)
  shape = files.KINDS.get(kind)
  for how in DAMAGES:
    copy = tmp_path / how
    shutil.copytree(base, copy)
    if not _damage(copy / relative, how, shape):
      continue
    before = _snapshot(copy)
    if kind in TOLERATED:
      assert read(copy) == TOLERATED[kind], how
    else:
      with pytest.raises(UserError) as e:
        read(copy)
      message = str(e.value)
      assert "\n" not in message and str(copy / relative) in message, (how, message)
    assert _snapshot(copy) == before, how


@pytest.mark.parametrize("value,words", [
    ({"members": [{"args": ["--workdir=a"]}, {}]}, "missing key 'members[1].args'"),
    ({"members": {"args": []}}, "key 'members' is a JSON object, not a JSON list"),
    ([1, 2, 3], "the file is a JSON list, not a JSON object"),
])
def test_the_shape_problem_names_the_key(value, words):
  assert files.problem(value, files.KINDS["members file"]) == words


def _one_error_line(r: subprocess.CompletedProcess, needle: str) -> None:
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
  assert needle in lines[0] and "Traceback" not in r.stderr + r.stdout, lines[0]


def test_train_py_answers_a_damaged_hf_folder_and_members_file_in_one_line(base, corpus,
                                                                          tmp_path):
  """The program around the readers: train.py with random bytes for the HF weights, and with a
  members file whose member lacks its args (the readers above cover every other damage); two
  programs at once to save time."""
  import shutil
  from tests.helpers import hf_runs
  from tests.helpers.runs import tiny_flags
  shutil.copytree(base / "hf", tmp_path / "hf")
  _damage(tmp_path / "hf" / "model.safetensors", "random_bytes", None)
  shape = hf_runs.run_config("transformer").model
  flags = tiny_flags(corpus, **{f"model.{k}": shape[k] for k in (
      "variant", "vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim",
      "ffn_dim", "max_seq_len")}, **{"train.steps": 0})
  members = tmp_path / "members.json"
  members.write_text(json.dumps({"members": [{"workdir": "a"}]}))
  cases = [(["train.py", f"--workdir={tmp_path / 'w'}", *flags,
             f"--config.init_from_hf={tmp_path / 'hf'}"],
            f"{tmp_path / 'hf' / 'model.safetensors'}: damaged safetensors file"),
           (["train.py", f"--population={members}"],
            f"{members}: missing key 'members[0].args'")]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  procs = [(subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env), needle)
           for args, needle in cases]
  for proc, needle in procs:
    out, err = proc.communicate(timeout=300)
    _one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), needle)


def test_a_torn_last_log_line_is_skipped_and_mended_before_the_next_row(tmp_path, capsys):
  """A writer killed mid-line leaves a metrics log whose last line is cut short: readers skip it
  (saying so once), a resumed writer cuts it off before appending; damage on any other line is
  one error naming the file and the line."""
  from diff_transformer.runs.folder import RunFolder
  folder = RunFolder(tmp_path)
  whole = [{"step": 1, "kind": "train", "loss": 2.5}, {"step": 2, "kind": "train", "loss": 2.4}]
  text = "".join(json.dumps(r) + "\n" for r in whole)
  folder.metrics.write_text(text + '{"step": 3, "kind": "tr')
  assert folder.metric_rows() == whole
  assert "line 3 was cut short" in capsys.readouterr().out
  files.mend_jsonl_tail(folder.metrics)
  assert folder.metrics.read_text() == text
  folder.metrics.write_text(text + json.dumps(whole[0]))  # whole, only its newline missing
  files.mend_jsonl_tail(folder.metrics)
  assert folder.metric_rows() == whole + whole[:1]
  folder.metrics.write_text('{"step": 1, "ki\n' + text)
  with pytest.raises(UserError, match=r"metrics.jsonl: line 1: damaged JSON"):
    folder.metric_rows()
