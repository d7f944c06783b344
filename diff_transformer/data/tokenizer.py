"""Tokenizers with one small interface: a file-free byte tokenizer, an offline byte-level BPE, and
any Hugging Face `tokenizers` file a user brings (`file`, e.g. a Llama or GPT-NeoX tokenizer.json).

byte and bpe map any str losslessly: decode(encode(s)) == s (a user's file does if its model
does). The end-of-text id separates (and opens)
documents in the token streams; `checksum` identifies the exact vocabulary so a checkpoint
trained on one tokenizer is never silently evaluated with another (`assert_compatible`).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import ml_collections

from diff_transformer.data.common import DataError
from diff_transformer.files import read_json
from diff_transformer.data.tiktoken_file import TIKTOKEN_FILE, TiktokenTokenizer  # tiktoken: lazily

EOT_TOKEN = "<|endoftext|>"
TOKENIZERS = ("byte", "bpe", "file", "tiktoken")
# End-of-text of a user's tokenizer file: the first of these it has.
EOT_CANDIDATES = (EOT_TOKEN, "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "<|im_end|>")
TOKENIZER_FILE = "tokenizer.json"


class Tokenizer(Protocol):
  name: str
  vocab_size: int
  eot_id: int
  checksum: str

  def encode(self, text: str) -> list[int]: ...
  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...
  def decode(self, ids: Iterable[int]) -> str: ...


def describe(tokenizer: Tokenizer) -> dict:
  """What a checkpoint or metadata.json records about a tokenizer."""
  return dict(name=tokenizer.name, vocab_size=int(tokenizer.vocab_size),
              eot_id=int(tokenizer.eot_id), checksum=tokenizer.checksum,
              **getattr(tokenizer, "extra_record", {}))


class ByteTokenizer:
  """UTF-8 bytes are ids 0..255; 256 is end-of-text. No files, fixed checksum."""
  name = "byte"
  vocab_size = 257
  eot_id = 256
  checksum = hashlib.sha256(b"diff_transformer byte tokenizer v1: utf-8 bytes 0-255, eot 256"
                            ).hexdigest()

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [self.encode(t) for t in texts]

  def decode(self, ids: Iterable[int]) -> str:
    # Ids >= 256 (end-of-text) carry no bytes; a cut multi-byte char decodes to U+FFFD.
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class BPETokenizer:
  """Byte-level BPE from HF `tokenizers`; the tokenizer.json content defines it (and its hash)."""
  name = "bpe"
  eot_candidates: tuple[str, ...] = (EOT_TOKEN,)

  def __init__(self, tokenizer) -> None:
    self._tok = tokenizer
    self.vocab_size = tokenizer.get_vocab_size()
    found = [t for t in self.eot_candidates if tokenizer.token_to_id(t) is not None]
    if not found:
      raise DataError(f"{self.name} tokenizer has none of the end-of-text tokens "
                      f"{', '.join(self.eot_candidates)}")
    self.eot_token = found[0]
    self.eot_id = tokenizer.token_to_id(self.eot_token)
    self.checksum = hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()

  @classmethod
  def from_file(cls, path: str | Path) -> "BPETokenizer":
    return cls(read_hf_tokenizer(path))

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int) -> "BPETokenizer":
    """Trains on the given texts; deterministic for the same texts in the same order."""
    from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers, trainers
    if vocab_size < 257 + 1:
      raise DataError(f"data.bpe_vocab_size: must be > 257 (256 bytes + {EOT_TOKEN}), got "
                      f"{vocab_size}")
    tok = HFTokenizer(models.BPE())
    # No prefix space and no normalizer: decode(encode(s)) == s exactly.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return cls(tok)

  def save(self, path: str | Path) -> None:
    Path(path).write_text(self._tok.to_str(), encoding="utf-8")

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)


class FileTokenizer(BPETokenizer):
  """A user's `tokenizers` file (any model: BPE, Unigram, WordPiece), copied into the prepared
  directory and checksummed like the built-in BPE; end-of-text is the first EOT_CANDIDATES token
  it has."""
  name = "file"
  eot_candidates = EOT_CANDIDATES

  @classmethod
  def from_file(cls, path: str | Path) -> "FileTokenizer":
    return cls(read_hf_tokenizer(path))


def read_hf_tokenizer(path: str | Path):
  """A Hugging Face tokenizers file (checked: a damaged one is one DataError line)."""
  from tokenizers import Tokenizer as HFTokenizer
  path = Path(path)
  if not path.is_file():
    raise DataError(f"{path}: tokenizer file not found (prepare_data.py writes or copies it)")
  text = json.dumps(read_json(path, DataError, "tokenizer file"))
  try:
    return HFTokenizer.from_str(text)
  except Exception as e:  # tokenizers raises a bare Exception for a file it cannot use
    raise DataError(f"{path}: not a Hugging Face tokenizers file ({str(e).splitlines()[0]})"
                    ) from None


def padded_vocab_size(ids: int, multiple: int) -> int:
  """Model vocabulary rows for a tokenizer of `ids` ids: rounded up to `multiple` (0: ids)."""
  return -(-ids // multiple) * multiple if multiple > 0 else ids


def check_name(name: object) -> None:
  if name not in TOKENIZERS:
    raise DataError(f"data.tokenizer: unknown tokenizer '{name}'; choose one of "
                    f"{', '.join(TOKENIZERS)}")


def build_tokenizer(data_config: ml_collections.ConfigDict, directory: str | Path | None = None,
                    train_texts: Iterable[str] | None = None) -> Tokenizer:
  """The tokenizer config.data asks for.

  byte: needs nothing. bpe: loads <directory>/tokenizer.json when it exists, else trains on
  `train_texts` (and saves it there when `directory` is given).
  """
  check_name(data_config.tokenizer)
  if data_config.tokenizer == "byte":
    return ByteTokenizer()
  path = Path(directory) / TOKENIZER_FILE if directory is not None else None
  if data_config.tokenizer == "tiktoken":
    record = Path(directory) / "tiktoken.json" if directory is not None else None
    if record is None or not record.is_file():
      raise DataError(f"data.tokenizer: 'tiktoken' needs {record} (prepare_data.py "
                      "--tiktoken_file writes it)")
    return TiktokenTokenizer(record.with_name(TIKTOKEN_FILE),
                             read_json(record, DataError, "tiktoken record")["encoding"])
  if data_config.tokenizer == "file":
    if path is None or not path.is_file():
      raise DataError(f"data.tokenizer: 'file' needs {path} (prepare_data.py --tokenizer_file "
                      "copies it there)")
    return FileTokenizer.from_file(path)
  if path is not None and path.is_file():
    return BPETokenizer.from_file(path)
  if train_texts is None:
    raise DataError(f"{path}: no BPE tokenizer there and no text given to train one; run "
                    "prepare_data.py")
  tok = BPETokenizer.train(train_texts, int(data_config.bpe_vocab_size))
  if path is not None:
    tok.save(path)
  return tok


def load_tokenizer(recorded: dict, directory: str | Path) -> Tokenizer:
  """Loads the tokenizer a metadata.json describes and checks it is the recorded one."""
  name = recorded.get("name")
  check_name(name)
  tok: Tokenizer
  if name == "tiktoken":
    tok = TiktokenTokenizer(Path(directory) / TIKTOKEN_FILE, str(recorded.get("encoding")))
  elif name == "byte":
    tok = ByteTokenizer()
  else:
    kind = FileTokenizer if name == "file" else BPETokenizer
    tok = kind.from_file(Path(directory) / TOKENIZER_FILE)
  assert_compatible(recorded, tok)
  return tok


def assert_compatible(recorded: dict, current: Tokenizer) -> None:
  """Raises DataError (one line) if `recorded` (describe() of another tokenizer) differs."""
  now = describe(current)
  for key in ("name", "vocab_size", "eot_id", "checksum"):
    if recorded.get(key) != now[key]:
      def show(d: dict) -> str:
        return (f"{d.get('name')} (vocab {d.get('vocab_size')}, eot {d.get('eot_id')}, sha256 "
                f"{str(d.get('checksum'))[:12]})")
      raise DataError(f"tokenizer mismatch on {key}: recorded {show(recorded)} but the data "
                      f"uses {show(now)}")
