"""Sharded prepared data: many small shards read exactly like one, and a directory in the
pre-shard layout (format 1: one train.bin / val.bin) still loads."""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from diff_transformer.data import (DataError, open_dataset, prepare_files, train_iterator,
                                   unigram_entropy, validation_batches)
from tests.helpers.data import data_config, text as make_text


@pytest.fixture(scope="module")
def two_layouts(tmp_path_factory) -> tuple[Path, Path]:
  """The same 30 documents prepared into one shard per split and into shards of <= 64 tokens."""
  rng = random.Random(1)
  raw = tmp_path_factory.mktemp("raw")
  with open(raw / "docs.jsonl", "w") as f:
    for n in rng.choices(range(1, 25), k=30):
      f.write(json.dumps({"text": make_text(rng, n)}) + "\n")
  out = tmp_path_factory.mktemp("prep")
  prepare_files([raw], out / "one", tokenizer="byte", val_fraction=0.2, progress=False)
  prepare_files([raw], out / "many", tokenizer="byte", val_fraction=0.2, progress=False,
                shard_tokens=64)
  return out / "one", out / "many"


def _batches(path: Path) -> list[dict]:
  ds = open_dataset(data_config(path))
  cfg = data_config(path)
  val = list(validation_batches(ds, cfg, 4))
  it = train_iterator(ds, cfg, 4, seed=3)
  return val + [next(it) for _ in range(6)]


def _same(a: list[dict], b: list[dict]) -> None:
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def test_shards_read_as_one_stream(two_layouts):
  one, many = (open_dataset(data_config(p)) for p in two_layouts)
  shards = many.shards("train")
  assert len(one.shards("train")) == 1 and len(shards) > 3
  for k, shard in enumerate(shards):
    stream = many.shard_tokens("train", k)
    offsets = many.shard_offsets("train", k)
    assert stream[0] == stream[-1] == many.eot_id and offsets[-1] == len(stream) - 1
    # A shard closes at the first document that takes it to 64 tokens.
    assert k == len(shards) - 1 or offsets[-2] + 1 < 64 <= len(stream)
  for split in ("train", "val"):
    docs_one, docs_many = one.document_tokens(split), many.document_tokens(split)
    assert len(docs_one) == len(docs_many)
    assert all(np.array_equal(a, b) for a, b in zip(docs_one, docs_many))
    counts = [{k: v for k, v in d.metadata["splits"][split].items() if k != "shards"}
              for d in (one, many)]
    assert counts[0] == {**counts[1], "stream_tokens": counts[0]["stream_tokens"]}
  assert unigram_entropy(one) == unigram_entropy(many)
  _same(_batches(two_layouts[0]), _batches(two_layouts[1]))  # same chunks in the same order


def test_pre_shard_layout_still_loads(two_layouts, tmp_path):
  """Format 1 (train.bin, train.idx.npy, ... named in metadata) gives the same batches."""
  old = tmp_path / "old"
  shutil.copytree(two_layouts[0], old)
  meta = json.loads((old / "metadata.json").read_text())
  for split in ("train", "val"):
    entry = meta["splits"][split]
    [shard] = entry.pop("shards")
    (old / shard["file"]).rename(old / f"{split}.bin")
    (old / shard["index"]).rename(old / f"{split}.idx.npy")
    entry.update(file=f"{split}.bin", index=f"{split}.idx.npy")
  meta["format"] = 1
  (old / "metadata.json").write_text(json.dumps(meta))
  _same(_batches(two_layouts[0]), _batches(old))
  (old / "val.bin").write_bytes(b"\0\0")
  with pytest.raises(DataError, match=r"val.bin: missing or not \d+ bytes"):
    open_dataset(data_config(old))


@pytest.mark.parametrize("kwargs,match", [(dict(shard_tokens=1), "--shard_tokens: must be >= 2"),
                                          (dict(workers=0), "--workers: must be >= 1")])
def test_bad_shard_settings_are_one_line(tmp_path, kwargs, match):
  (tmp_path / "a.txt").write_text("some text\n")
  with pytest.raises(DataError, match=match) as e:
    prepare_files([tmp_path / "a.txt"], tmp_path / "x", tokenizer="byte", **kwargs)
  assert "\n" not in str(e.value) and not (tmp_path / "x").exists()


def test_shards_record_their_id_range_and_checksum(two_layouts):
  import hashlib
  from diff_transformer.data.dataset import verify_prepared
  many = open_dataset(data_config(two_layouts[1]))
  for split in ("train", "val"):
    for k, shard in enumerate(many.shards(split)):
      assert shard["max_id"] == int(many.shard_tokens(split, k).max())
      assert shard["sha256"] == hashlib.sha256((many.path / shard["file"]).read_bytes()).hexdigest()
  got = verify_prepared(two_layouts[1])
  assert got["checksums_compared"] == got["shards"] == sum(len(many.shards(s)) for s in
                                                           ("train", "val"))


def test_ids_outside_the_vocabulary_are_one_line_naming_shard_id_vocab_and_rebuild(two_layouts,
                                                                                  tmp_path, capsys):
  """The issue's case: a shard overwritten with id 65535 at the same byte length. Opening checks
  only what metadata.json records (cheap), so --verify's scan finds it; a recorded id out of
  range stops the opening itself. Both lines name the shard, the id, the vocabulary and the fix."""
  import prepare_data
  from diff_transformer.data.dataset import verify_prepared
  bad = tmp_path / "bad"
  shutil.copytree(two_layouts[0], bad)
  meta = json.loads((bad / "metadata.json").read_text())
  shard = meta["splits"]["train"]["shards"][0]
  ids = np.fromfile(bad / shard["file"], dtype=meta["dtype"])
  np.full_like(ids, 65535).tofile(bad / shard["file"])
  vocab = open_dataset(data_config(bad)).vocab_size  # sizes match: opening cannot tell
  with pytest.raises(DataError) as e:
    verify_prepared(bad)
  line = str(e.value)
  assert "\n" not in line and shard["file"] in line and "token id 65535" in line
  assert f"vocabulary of {vocab}" in line and "python prepare_data.py --input" in line
  with pytest.raises(DataError, match="token id 65535"):
    prepare_data.main(["--verify", str(bad)])
  meta["splits"]["train"]["shards"][0]["max_id"] = 65535  # what prepare records for such ids
  (bad / "metadata.json").write_text(json.dumps(meta))
  with pytest.raises(DataError, match=f"token id 65535 is outside the tokenizer's vocabulary of "
                                      f"{vocab}"):
    open_dataset(data_config(bad))
  # An id inside the vocabulary but a changed byte: only the checksum sees it.
  changed = tmp_path / "changed"
  shutil.copytree(two_layouts[0], changed)
  ids = np.fromfile(changed / shard["file"], dtype=meta["dtype"])
  ids[1] = (ids[1] + 1) % vocab
  ids.tofile(changed / shard["file"])
  with pytest.raises(DataError, match="its sha256 differs from the one metadata.json recorded"):
    verify_prepared(changed)
  # Metadata from before these fields: opens with a one-line note; --verify still scans ids.
  old = tmp_path / "old"
  shutil.copytree(two_layouts[0], old)
  meta = json.loads((old / "metadata.json").read_text())
  for split in ("train", "val"):
    for s in meta["splits"][split]["shards"]:
      s.pop("max_id"), s.pop("sha256")
  (old / "metadata.json").write_text(json.dumps(meta))
  capsys.readouterr()
  open_dataset(data_config(old))
  note = capsys.readouterr().err.strip().splitlines()
  assert len(note) == 1 and note[0].startswith("note: ") and "--verify" in note[0]
  assert verify_prepared(old)["checksums_compared"] == 0
  assert prepare_data.main(["--verify", str(old)]) == 0
