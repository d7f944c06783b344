"""A user's own tokenizer file, made with `tokenizers` as a user would."""
from __future__ import annotations

from pathlib import Path


def user_tokenizer(path: Path, texts: list[str]) -> Path:
  """A byte-level BPE made with `tokenizers` as a user would, with </s> as its end-of-text."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  path.parent.mkdir(parents=True, exist_ok=True)
  tok.save(str(path))
  return path
