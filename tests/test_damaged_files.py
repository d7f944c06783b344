"""Damaged input files. Every kind the checked reader knows (diff_transformer/files.py KINDS), and
safetensors weights, is damaged in each way (cut short, random bytes, not UTF-8, the wrong JSON
type, a required key missing or of the wrong type, nesting or an integer the parser itself cannot
hold) and read as the program that reads it does:
one UserError line naming the file, and the folder unchanged. The programs themselves answer
the damaged inputs users met with one `error:` line, exit status 2 and no traceback."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diff_transformer import file_kinds, files
from diff_transformer.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
DAMAGES = ("truncated", "random_bytes", "not_utf8", "wrong_type", "deep_nesting", "huge_integer")
_WRONG = {dict: [], list: {}, str: 7, int: "7", float: "7", bool: "yes"}
_MISSING = object()


def _whole_file_damage(data: bytes, how: str, shape: file_kinds.Shape | None) -> bytes | None:
  """The file's bytes damaged as a whole; None where the damage does not apply to its kind. In a
  JSON-lines file the damage is a line before the rows (a damaged last line is a torn tail)."""
  if how == "truncated":
    return data[:len(data) // 2]
  if how == "random_bytes":
    return np.random.default_rng(len(data)).bytes(max(len(data), 64))
  if how == "not_utf8":
    return b"\xff\xfe" + data
  if shape is None:  # a binary file: only the byte-level damages apply
    return None
  bad = {"deep_nesting": "[" * 100_000 + "]" * 100_000,  # deeper than the parser's recursion
         "huge_integer": '{"x": ' + "7" * 5000 + "}",  # longer than Python converts to an int
         "wrong_type": json.dumps([] if shape.lines else _WRONG[shape.top])}[how]
  return (bad + "\n").encode() + data if shape.lines else bad.encode()


def field_damages(value, shape: file_kinds.Shape, path: tuple = ()) -> list[tuple]:
  """(path, how, bad value) for every declared field present in `value`, nested ones included:
  missing (where required), the wrong type, NaN and Infinity for numbers, out of range, not one
  of the choices."""
  out = []
  if shape.top is dict and isinstance(value, dict):
    for key, spec in shape.keys:
      f = file_kinds.field(spec)
      if not f.optional:
        out.append((path + (key,), "missing", _MISSING))
      if value.get(key) is not None:
        out += _value_damages(value[key], f, path + (key,))
    if shape.values is not None and value:
      key = next(iter(value))
      out += _value_damages(value[key], file_kinds.field(shape.values), path + (key,))
  if shape.each is not None and not shape.lines:
    where = path + ((shape.each_in,) if shape.each_in else ())
    items = value[shape.each_in] if shape.each_in else value
    if items:
      out += field_damages(items[0], shape.each, where + (0,))
  return out


def _value_damages(value, f: file_kinds.Field, path: tuple) -> list[tuple]:
  if isinstance(f.kind, file_kinds.Shape):
    return [(path, "wrong type", _WRONG[f.kind.top])] + field_damages(value, f.kind, path)
  out = [(path, "wrong type", _WRONG[f.kind])]
  if f.kind is float:
    out += [(path, "NaN", float("nan")), (path, "Infinity", float("inf"))]
  if f.above is not None and f.kind is not list:
    out.append((path, "out of range", f.kind(f.above)))
  if f.at_least is not None:
    out.append((path, "out of range", value[:int(f.at_least) - 1] if f.kind is list
                else f.kind(f.at_least - 1)))
  if f.choices:
    out.append((path, "not a choice", "not-" + str(f.choices[0])))
  if f.each is not None and value:
    out += _value_damages(value[0], file_kinds.field(f.each), path + (0,))
  return out


def _with(value, path: tuple, bad):
  """A deep copy of `value` with the item at `path` replaced by `bad` (or removed)."""
  value = json.loads(json.dumps(value))
  *above, last = path
  holder = value
  for key in above:
    holder = holder[key]
  if bad is _MISSING:
    del holder[last]
  else:
    holder[last] = bad
  return value


def _damaged_versions(data: bytes, shape: file_kinds.Shape | None, kind: str):
  """(how, damaged bytes, the words the refusal must hold) for every damage of one file."""
  for how in DAMAGES:
    damaged = _whole_file_damage(data, how, shape)
    if damaged is not None:
      yield how, damaged, ""
  if shape is None or (shape.top is not dict and not shape.lines):
    return
  rows = [json.loads(l) for l in data.decode().splitlines()] if shape.lines else [json.loads(data)]
  row_shape = shape.each if shape.lines else shape
  for path, how, bad in field_damages(rows[0], row_shape):
    name = ".".join(str(k) for k in path if isinstance(k, str))
    changed = [_with(rows[0], path, bad)] + rows[1:]
    text = ("".join(json.dumps(r) + "\n" for r in changed) if shape.lines
            else json.dumps(changed[0]))
    yield f"{name} {how}", text.encode(), [k for k in path if isinstance(k, str)][-1]
  for key, bad in RUN_CONFIG_VALUES.get(kind, ()):  # values a command line's validate refuses
    section, name = key.split(".")
    yield f"{key} {bad}", json.dumps(_with(rows[0], (section, name), bad)).encode(), key


# The run config's values pass config.validate, as a command line's do.
RUN_CONFIG_VALUES = {"run config": (("model.max_seq_len", 10**18),
                                    ("model.rope_theta", float("nan")),
                                    ("train.lr", float("inf")), ("model.num_layers", 0))}


@pytest.fixture(scope="module")
def base(tmp_path_factory, corpus):
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
  (run / "metrics.jsonl").write_text("".join(json.dumps(dict(step=s, kind="train", loss=2.0))
                                              + "\n" for s in (1, 2)))
  (run / "eval" / "loss.json").write_text(json.dumps(
      {"suite": "loss", "step": 1, "variant": "transformer", "loss": 2.0}))
  (root / "data").mkdir()
  (root / "data" / "metadata.json").write_bytes((corpus / "metadata.json").read_bytes())
  (root / "members.json").write_text(json.dumps(
      {"name": "cell", "members": [{"args": ["--workdir=a"]}]}))
  (root / "tok").mkdir()
  BPETokenizer.train(["abc abd abe " * 50], 300).save(root / "tok" / "tokenizer.json")
  (root / "tok" / "tiktoken.json").write_text(json.dumps({"encoding": "cl100k_base"}))
  (root / "study").mkdir()
  (root / "study" / "study.json").write_text(json.dumps(
      {"study": {"name": "s", "command": "study.py", "wall_seconds": 60.0}}))
  (root / "study" / "invocations.jsonl").write_text("".join(json.dumps(
      dict(command="study.py", wall_seconds=w, trained=2)) + "\n" for w in (60.0, 30.5)))
  (root / "peak.json").write_text(json.dumps({"tflops": 0.2, "dtype": "float32"}))
  (root / "gpu").mkdir()
  (root / "gpu" / "hlo_diff.txt.gz").write_bytes(gzip.compress(TINY_HLO.encode()))
  kernel = dict(name="loop_fusion", ms=0.5, calls=1.0, hlo_op="n")
  (root / "gpu" / "profile.json").write_text(json.dumps(dict(
      cells=[dict(variant="diff", kernels=[kernel], other_kernels=[kernel])],
      hlo=dict(diff="hlo_diff.txt.gz"))))
  return root


def _spec():
  from diff_transformer.model.attention import spec_from_config
  from tests.helpers import hf_runs
  return spec_from_config(hf_runs.run_config("transformer").model)


TINY_HLO = """HloModule tiny

ENTRY %main (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  ROOT %n = f32[2]{0} negate(%p)
}
"""


def _hlo_kernels():
  sys.path.insert(0, str(ROOT / "tools"))
  import hlo_kernels  # a program's module, found on its folder's path
  return hlo_kernels


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
      "metrics log": ("run/metrics.jsonl", lambda b: RunFolder(b / "run").metric_rows()),
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
      "study invocations": ("study/invocations.jsonl",
                            lambda b: invocations.read_invocations(b / "study")),
      # a damaged peak cache is measured again: read as absent
      "peak cache": ("peak.json", lambda b: peak._cached_tflops(b / "peak.json")),
      "GPU check profile": ("gpu/profile.json", lambda b: _hlo_kernels().report(
          b / "gpu" / "profile.json", "diff", 5, False)),
      "safetensors": ("hf/model.safetensors", lambda b: check_folder(_spec(), b / "hf")),
  }


TOLERATED = {"study results": {}, "peak cache": None}  # kind -> what a damaged file reads as


def test_the_damage_table_covers_every_kind_the_reader_knows():
  assert set(_readers()) == set(file_kinds.KINDS) | {"safetensors"}


def _snapshot(folder: Path) -> dict[str, bytes]:
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
          if p.is_file()}


@pytest.mark.parametrize("kind", sorted(file_kinds.KINDS) + ["safetensors"])
def test_every_damaged_file_is_one_line_naming_it_and_nothing_else_changes(base, tmp_path, kind):
  """Each whole-file damage, and each declared field missing, of the wrong type, NaN, Infinity,
  out of range or not one of its choices: one line naming the file and the field."""
  import shutil
  relative, read = _readers()[kind]
  if kind != "tiktoken record":  # a valid tiktoken record needs the tiktoken file beside it
    read(base)
  shape = file_kinds.KINDS.get(kind)
  copy = tmp_path / "copy"
  shutil.copytree(base, copy)
  original = (copy / relative).read_bytes()
  cases = list(_damaged_versions(original, shape, kind))
  assert len(cases) >= 3, cases
  for how, damaged, words in cases:
    (copy / relative).write_bytes(damaged)
    before = _snapshot(copy)
    if kind in TOLERATED:
      assert read(copy) == TOLERATED[kind], how
    elif how == "truncated" and shape is not None and shape.lines:
      read(copy)  # a torn last line: skipped, with a warning
    else:
      with pytest.raises(UserError) as e:
        read(copy)
      message = str(e.value)
      assert "\n" not in message and str(copy / relative) in message, (how, message)
      assert str(words) in message, (how, message)
    assert _snapshot(copy) == before, how
    (copy / relative).write_bytes(original)


@pytest.mark.parametrize("value,words", [
    ({"members": [{"args": ["--workdir=a"]}, {}]}, "missing key 'members[1].args'"),
    ({"members": {"args": []}}, "key 'members' is a JSON object, not a JSON list"),
    ({"members": []}, "key 'members' has 0 items; it needs at least 1"),
    ({"members": [{"args": [1, 2]}]}, "key 'members[0].args[0]' is an integer, not a string"),
    ([1, 2, 3], "the file is a JSON list, not a JSON object"),
])
def test_the_shape_problem_names_the_key(value, words):
  assert file_kinds.problem(value, file_kinds.KINDS["members file"]) == words


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
  weights = tmp_path / "hf" / "model.safetensors"
  weights.write_bytes(_whole_file_damage(weights.read_bytes(), "random_bytes", None))
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


def test_a_suite_result_without_a_metric_the_report_reads_is_one_line(tmp_path):
  """eval.py --compare and the report read each suite's metrics: a loss result without its
  AR-hit split is refused naming the file and the key, before any table is written."""
  from diff_transformer.errors import EvalError
  from diff_transformer.evaluation.report import load
  path = tmp_path / "loss.json"
  path.write_text(json.dumps({"suite": "loss", "step": 1, "variant": "diff", "loss": 2.0,
                              "perplexity": 7.4, "others": {"loss": 2.1}}))
  with pytest.raises(EvalError,
                     match=r"loss.json: not a whole loss result \(missing key 'ar_hit'\)"):
    load(tmp_path)


def test_export_refuses_a_text_tokenizer_record_without_its_eot_id(tmp_path):
  pytest.importorskip("transformers")
  from diff_transformer.interop import InteropError
  from diff_transformer.interop.export import check_export
  with pytest.raises(InteropError, match=r"tokenizer_record.json: missing key 'eot_id'"):
    check_export(_spec(), {"name": "byte", "vocab_size": 257}, tmp_path / "out", tmp_path)


def test_hlo_kernels_refuses_what_is_not_a_saved_hlo_in_one_line(base, tmp_path):
  """tools/hlo_kernels.py --hlo: a missing file, a folder, random bytes, an empty or a non-HLO
  gzip file each refused in one line naming it (exit 2, nothing printed before)."""
  hlo_kernels = _hlo_kernels()
  assert hlo_kernels.read_hlo(base / "gpu" / "hlo_diff.txt.gz").entry == "main"
  cases = {"missing.txt.gz": (None, "not found"), "folder": ("dir", "a folder"),
           "random.txt.gz": (np.random.default_rng(0).bytes(64), "not a gzip file"),
           "empty.txt.gz": (gzip.compress(b""), "holds no HLO module"),
           "text.txt.gz": (gzip.compress(b"hello\n"), "holds no HLO module")}
  for name, (content, words) in cases.items():
    path = tmp_path / name
    if content == "dir":
      path.mkdir()
    elif content is not None:
      path.write_bytes(content)
    with pytest.raises(UserError, match=words):
      hlo_kernels.read_hlo(path)
  r = subprocess.run([sys.executable, str(ROOT / "tools" / "hlo_kernels.py"), "--hlo",
                      str(base / "gpu" / "hlo_diff.txt.gz"), str(tmp_path / "text.txt.gz")],
                     capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  _one_error_line(r, "text.txt.gz: holds no HLO module")
  assert r.stdout == ""
