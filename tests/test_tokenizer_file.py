"""prepare_data.py --tokenizer_file: a user's `tokenizers` file is used as it is, recorded and
checksummed like the built-in BPE (round trip, end-of-text found), and a run whose tokenizer file
changed is refused on resume in one line."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from diff_transformer.data import DataError, prepare_files, read_metadata
from diff_transformer.data.tokenizer import FileTokenizer
from tests.helpers.runs import refused_here, train_here, write_corpus
from tests.helpers.tokenizers import user_tokenizer


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("tokfile")
  write_corpus(tmp / "corpus", docs=8)
  texts = [p.read_text() for p in sorted((tmp / "corpus").iterdir())]
  user = user_tokenizer(tmp / "user" / "tokenizer.json", texts)
  meta = prepare_files([tmp / "corpus"], tmp / "data", tokenizer="file", tokenizer_file=user,
                       progress=False)
  return tmp, user, meta


def test_file_tokenizer_is_recorded_and_round_trips(prepared):
  tmp, user, meta = prepared
  tok = FileTokenizer.from_file(tmp / "data" / "tokenizer.json")
  assert (tmp / "data" / "tokenizer.json").read_bytes() == user.read_bytes()
  assert meta["tokenizer"]["name"] == "file" and tok.eot_token == "</s>"
  assert meta["tokenizer"]["eot_id"] == tok.eot_id and meta["tokenizer"]["checksum"] == tok.checksum
  text = "The king's letter, a ghost at sea: \u00e9t\u00e9 \U0001f642\n"
  assert tok.decode(tok.encode(text)) == text


def test_bad_tokenizer_file_is_one_line(tmp_path, prepared):
  tmp, _, _ = prepared
  bad, other = tmp_path / "tokenizer.json", tmp_path / "other.json"
  bad.write_text("{not json")
  other.write_text('{"model": 3}')
  for path, needle in ((tmp_path / "missing.json", "not found"), (bad, "damaged JSON"),
                       (other, "not a Hugging Face")):
    with pytest.raises(DataError, match=needle) as e:
      prepare_files([tmp / "corpus"], tmp_path / "out", tokenizer="file", tokenizer_file=path)
    assert "\n" not in str(e.value)
  assert not (tmp_path / "out").exists()


def test_changed_tokenizer_file_is_refused_on_resume(prepared, tmp_path):
  """In-process (what train.py runs; its one `error:` line is checked in test_reliability)."""
  from tokenizers import Tokenizer
  tmp, _, _ = prepared
  data = tmp_path / "data"
  import shutil
  shutil.copytree(tmp / "data", data)
  # The presets' padding: model.vocab_size (tiny_overrides' value) gives way to the 300 ids
  # rounded up to 128.
  overrides = {"data.tokenizer": "file", "model.vocab_multiple": 128, "train.steps": 2,
               "train.eval_every": 2}
  train_here(tmp_path / "run", data, **overrides)
  record = json.loads((tmp_path / "run" / "tokenizer_record.json").read_text())
  assert record["name"] == "file" and record["vocab_size"] == 300
  assert record["vocab_padding"] == 84
  config = json.loads((tmp_path / "run" / "config.json").read_text())
  assert config["model"]["vocab_size"] == 384 and config["model"]["vocab_multiple"] == 128
  meta = read_metadata(data)
  for split in ("train", "val"):  # the padded ids 300..383 never occur in the data
    for shard in meta["splits"][split]["shards"]:
      assert np.fromfile(data / shard["file"], meta["dtype"]).max() < 300
  copied = (tmp_path / "run" / "tokenizer.json").read_bytes()
  assert copied == (data / "tokenizer.json").read_bytes()
  tok = Tokenizer.from_file(str(data / "tokenizer.json"))
  tok.add_tokens(["castle-of-the-king"])
  tok.save(str(data / "tokenizer.json"))
  refused_here(tmp_path / "run", data, ("tokenizer",), **dict(overrides, **{"train.steps": 4}))


def _tiktoken_file(path: Path, text: str) -> Path:
  """A small .tiktoken ranks file trained with tiktoken's own reference trainer."""
  import base64
  from tiktoken._educational import bpe_train
  from tiktoken_ext.openai_public import r50k_pat_str
  ranks = bpe_train(text, 270, r50k_pat_str)
  path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
  return path


def test_tiktoken_file_is_recorded_round_trips_and_is_refused_if_changed(prepared, tmp_path):
  pytest.importorskip("tiktoken")
  from diff_transformer.data import open_dataset
  from diff_transformer.config import base_config
  tmp, _, _ = prepared
  text = "".join(p.read_text() for p in sorted((tmp / "corpus").iterdir())[:2])
  ranks = _tiktoken_file(tmp_path / "r50k_base.tiktoken", text)
  meta = prepare_files([tmp / "corpus"], tmp_path / "data", tokenizer="tiktoken",
                       tokenizer_file=ranks, progress=False)
  record = meta["tokenizer"]
  assert record["name"] == "tiktoken" and record["encoding"] == "r50k_base"
  assert record["eot_id"] == 50256 and record["vocab_size"] == 50257
  config = base_config().data
  config.update(dict(name="prepared", path=str(tmp_path / "data"), tokenizer="tiktoken",
                     seq_len=32))
  tok = open_dataset(config).tokenizer
  sample = "The king's ghost, at sea: \u00e9t\u00e9 \U0001f642 <|endoftext|>\n"
  assert tok.decode(tok.encode(sample)) == sample
  lines = (tmp_path / "data" / "tokenizer.tiktoken").read_text().splitlines()
  (tmp_path / "data" / "tokenizer.tiktoken").write_text("\n".join(lines[:-1]) + "\n")
  with pytest.raises(DataError, match="tokenizer mismatch") as e:
    open_dataset(config)
  assert "\n" not in str(e.value)
  with pytest.raises(DataError, match="unknown encoding 'nope'"):
    prepare_files([tmp / "corpus"], tmp_path / "x", tokenizer="tiktoken", tokenizer_file=ranks,
                  tiktoken_encoding="nope")


def test_parallel_tokenization_writes_the_same_files(prepared, tmp_path):
  """Two worker processes give byte-identical token files to one process."""
  tmp, user, _ = prepared
  meta = prepare_files([tmp / "corpus"], tmp_path / "two", tokenizer="file", tokenizer_file=user,
                       progress=False, workers=2)
  assert meta["tokenize"]["processes"] == 2 and meta["tokenize"]["tokens_per_s"] > 0
  for name in ("train-00000.bin", "val-00000.bin", "train-00000.idx.npy", "val-00000.idx.npy",
               "tokenizer.json"):
    assert (tmp_path / "two" / name).read_bytes() == (tmp / "data" / name).read_bytes(), name


def test_tiktoken_run_exports_tokenizer_files_that_encode_alike(prepared, tmp_path):
  """export.py of a tiktoken run: AutoTokenizer gives the run's ids (special-token text as plain
  text, cl100k's possessive digit groups too), and generation suppresses every id without a
  token (the id space's gaps and the padded rows)."""
  for module in ("tiktoken", "transformers", "torch"):
    pytest.importorskip(module)
  import shutil
  import transformers
  from diff_transformer.data import describe
  from diff_transformer.data.tiktoken_file import TIKTOKEN_FILE, TiktokenTokenizer
  from diff_transformer.interop import InteropError
  from diff_transformer.interop.export import export_run
  from diff_transformer.interop.hf_tokenizer import _onig_pattern, hf_tokenizer
  from tests.helpers import hf_runs
  tmp, _, _ = prepared
  text = "".join(p.read_text() for p in sorted((tmp / "corpus").iterdir())[:2])
  ranks = _tiktoken_file(tmp_path / "r50k_base.tiktoken", text + ",12345678" * 300)
  workdir = hf_runs.make_run(tmp_path / "run", hf_runs.run_config("transformer", vocab_size=50304))
  shutil.copyfile(ranks, workdir / TIKTOKEN_FILE)
  ours = TiktokenTokenizer(workdir / TIKTOKEN_FILE, "r50k_base")
  (workdir / "tokenizer_record.json").write_text(json.dumps(describe(ours)))
  export_run(workdir, tmp_path / "hf")
  theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  samples = [text[:3000], "The king's ghost, at sea: \u00e9t\u00e9 \U0001f642 <|endoftext|>\n",
             "  12345678  don't\n\n\tx \x00\u4e2d\u6587  ", "a<|endoftext|>b 3.14159\r\n",
             "12345678,1234567812345678"]
  for sample in samples:
    ids = theirs(sample, add_special_tokens=False)["input_ids"]
    assert ids == ours.encode(sample) and theirs.decode(ids) == sample
  assert theirs.eos_token_id == ours.eot_id == 50256
  used = set(theirs.get_vocab().values())
  gen = transformers.GenerationConfig.from_pretrained(tmp_path / "hf")
  assert gen.suppress_tokens == sorted(set(range(50304)) - used) and len(used) == 271
  # cl100k's `\p{N}{1,3}+` (possessive in tiktoken, not in tokenizers' regex) splits digits alike.
  cl100k = TiktokenTokenizer(ranks, "cl100k_base")
  shutil.copyfile(ranks, tmp_path / TIKTOKEN_FILE)
  converted = hf_tokenizer(describe(cl100k), tmp_path)
  for sample in samples:
    assert converted(sample, add_special_tokens=False)["input_ids"] == cl100k.encode(sample)
  with pytest.raises(InteropError, match="possessive counted repeat") as e:
    _onig_pattern(r"\p{N}{1,3}+\p{L}|\s", "made_up")
  assert "\n" not in str(e.value)
