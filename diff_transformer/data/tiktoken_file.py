"""tiktoken encodings from a local `.tiktoken` file (nothing is downloaded).

A `.tiktoken` file holds only the BPE ranks; the split pattern and special tokens come from
tiktoken's registry of OpenAI encodings by name (cl100k_base, o200k_base, r50k_base, p50k_base,
...), so `--tiktoken_encoding` (default: the file's stem) names which one the file is.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
from pathlib import Path

from diff_transformer.data.common import DataError

TIKTOKEN_FILE = "tokenizer.tiktoken"
EOT = "<|endoftext|>"


def read_ranks(path: Path) -> dict[bytes, int]:
  """{token bytes: rank} from the base64 'token rank' lines of a .tiktoken file."""
  ranks = {}
  try:
    for n, line in enumerate(path.read_bytes().splitlines(), 1):
      if line.strip():
        token, rank = line.split()
        ranks[base64.b64decode(token, validate=True)] = int(rank)
  except (ValueError, binascii.Error):
    raise DataError(f"{path}: line {n} is not '<base64 token> <rank>'; not a .tiktoken file"
                    ) from None
  return ranks


def encoding_params(name: str, ranks: dict[bytes, int]) -> dict:
  """tiktoken's own pattern and special tokens for encoding `name`, with `ranks` as its BPE."""
  import tiktoken_ext.openai_public as registry
  constructor = registry.ENCODING_CONSTRUCTORS.get(name)
  if constructor is None or name == "gpt2":
    known = sorted(n for n in registry.ENCODING_CONSTRUCTORS if n != "gpt2")
    raise DataError(f"--tiktoken_encoding: unknown encoding '{name}'; choose one of "
                    f"{', '.join(known)}")
  # The registry's constructors fetch their ranks from a URL; hand them the local ones instead.
  original = registry.load_tiktoken_bpe
  registry.load_tiktoken_bpe = lambda *args, **kwargs: ranks
  try:
    params = constructor()
  finally:
    registry.load_tiktoken_bpe = original
  params.pop("explicit_n_vocab", None)  # a file with other ranks defines its own size
  return params


class TiktokenTokenizer:
  """A tiktoken encoding read from a local file. Special-token text is encoded as plain text
  (encode_ordinary); end-of-text is the encoding's <|endoftext|>."""
  name = "tiktoken"

  def __init__(self, path: str | Path, encoding: str) -> None:
    import importlib.util
    if importlib.util.find_spec("tiktoken") is None:
      raise DataError("tiktoken: not installed (pip install tiktoken, or the hf extra)")
    import tiktoken
    path = Path(path)
    if not path.is_file():
      raise DataError(f"{path}: tiktoken file not found")
    self.encoding = encoding
    params = encoding_params(encoding, read_ranks(path))
    if EOT not in params["special_tokens"]:
      raise DataError(f"--tiktoken_encoding: '{encoding}' has no {EOT} token")
    self._enc = tiktoken.Encoding(**params)
    self.vocab_size = self._enc.n_vocab
    self.eot_id = params["special_tokens"][EOT]
    self.checksum = hashlib.sha256(encoding.encode() + b"\n" + path.read_bytes()).hexdigest()

  @property
  def extra_record(self) -> dict:
    return dict(encoding=self.encoding)

  def encode(self, text: str) -> list[int]:
    return self._enc.encode_ordinary(text)

  def encode_batch(self, texts) -> list[list[int]]:
    return self._enc.encode_ordinary_batch(list(texts))

  def decode(self, ids) -> str:
    specials = {self._enc.encode_single_token(t) for t in self._enc.special_tokens_set}
    return self._enc.decode([int(i) for i in ids if int(i) not in specials], errors="replace")
