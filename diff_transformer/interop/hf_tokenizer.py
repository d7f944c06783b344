"""The run's tokenizer as Hugging Face tokenizer files (`AutoTokenizer.from_pretrained(DIR)`).

BPE runs ship their `tokenizers` file as it is. The byte tokenizer (ids 0-255 = UTF-8 bytes,
256 = end-of-text) is written as an equivalent merge-free byte-level BPE, so exported byte runs
tokenize identically in transformers.
"""
from __future__ import annotations

from pathlib import Path

from diff_transformer.data.tokenizer import EOT_TOKEN, TOKENIZER_FILE, ByteTokenizer


def _bytes_to_unicode() -> dict[int, str]:
  """The byte -> printable character table of byte-level BPE (GPT-2's)."""
  printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
               + list(range(ord("®"), ord("ÿ") + 1)))
  table, extra = {}, 0
  for b in range(256):
    if b in printable:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return table


def byte_tokenizer():
  """A `tokenizers.Tokenizer` whose ids equal ByteTokenizer's for every string."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
  vocab = {char: b for b, char in _bytes_to_unicode().items()}
  vocab[EOT_TOKEN] = ByteTokenizer.eot_id
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(EOT_TOKEN, special=True)])
  return tok


def write_tokenizer(record: dict, workdir: Path, out: Path) -> None:
  """tokenizer.json + tokenizer_config.json for the run's recorded tokenizer."""
  from tokenizers import Tokenizer
  from transformers import PreTrainedTokenizerFast
  if record["name"] == "byte":
    tok = byte_tokenizer()
  else:  # bpe, or a user's tokenizers file: the run's checksummed copy
    tok = Tokenizer.from_file(str(Path(workdir) / TOKENIZER_FILE))
  eot = tok.id_to_token(int(record["eot_id"])) or EOT_TOKEN
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot)
  fast.save_pretrained(str(out))
