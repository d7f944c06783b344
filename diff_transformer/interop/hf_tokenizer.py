"""The run's tokenizer as Hugging Face tokenizer files (`AutoTokenizer.from_pretrained(DIR)`).

BPE runs ship their `tokenizers` file as it is. The byte tokenizer (ids 0-255 = UTF-8 bytes,
256 = end-of-text) is written as an equivalent merge-free byte-level BPE, so exported byte runs
tokenize identically in transformers. A tiktoken run's ranks become a byte-level BPE through
transformers' own TikTokenConverter (every pair of ranked pieces that joins into a ranked token is
a merge, prioritised by the joined token's rank: tiktoken's merge order), with the encoding's
special tokens at their tiktoken ids and special-token text split like plain text, as the run
encodes it.
"""
from __future__ import annotations

import re
from pathlib import Path

from diff_transformer.data.tiktoken_file import TIKTOKEN_FILE, encoding_params, read_ranks
from diff_transformer.data.tokenizer import EOT_TOKEN, TOKENIZER_FILE, ByteTokenizer
from diff_transformer.interop import InteropError


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


def _onig_pattern(pat_str: str, encoding: str) -> str:
  """tiktoken's split pattern in the regex dialect of `tokenizers` (Oniguruma), exactly.

  Oniguruma reads `{n,m}+` as "repeat the counted group" where tiktoken's engine reads it as
  possessive; at the end of an alternative (nothing after it to backtrack for) possessive and
  greedy match the same, so the `+` is dropped there. Anywhere else the export is refused."""
  counted = r"(\{\d+(?:,\d*)?\})\+"
  pattern = re.sub(counted + r"(?=\||$)", r"\1", pat_str)
  if re.search(counted, pattern):
    raise InteropError(f"tiktoken encoding {encoding}: its split pattern has a possessive counted "
                       "repeat that Hugging Face tokenizers cannot express exactly")
  return pattern


def tiktoken_tokenizer(record: dict, workdir: Path):
  """A `tokenizers.Tokenizer` whose ids equal the run's tiktoken encoding for every string."""
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
  from transformers.convert_slow_tokenizer import TikTokenConverter
  ranks_file = Path(workdir) / TIKTOKEN_FILE
  ranks = read_ranks(ranks_file)
  params = encoding_params(record["encoding"], ranks)
  pattern = _onig_pattern(params["pat_str"], record["encoding"])

  class LocalRanks(TikTokenConverter):  # the run's checked ranks; never a download
    @staticmethod
    def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
      return ranks

  vocab, merges = LocalRanks(pattern=pattern).extract_vocab_merges_from_model(str(ranks_file))
  vocab.update(params["special_tokens"])  # at tiktoken's ids (the id space may have gaps)
  tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                          for t in params["special_tokens"]])
  return tok


def hf_tokenizer(record: dict, workdir: Path):
  """The run's recorded tokenizer as a transformers fast tokenizer (save_pretrained writes
  tokenizer.json + tokenizer_config.json)."""
  from tokenizers import Tokenizer
  from transformers import PreTrainedTokenizerFast
  split_special = False
  if record["name"] == "byte":
    tok = byte_tokenizer()
  elif record["name"] == "tiktoken":
    tok, split_special = tiktoken_tokenizer(record, workdir), True  # as encode_ordinary
  else:  # bpe, or a user's tokenizers file: the run's checksummed copy
    tok = Tokenizer.from_file(str(Path(workdir) / TOKENIZER_FILE))
  eot = tok.id_to_token(int(record["eot_id"])) or EOT_TOKEN
  return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot,
                                 split_special_tokens=split_special)
