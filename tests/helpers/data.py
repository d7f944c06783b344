"""Synthetic text and a prepared-data config for the data-layer tests."""
from __future__ import annotations

import random
from pathlib import Path

from diff_transformer.config import base_config

SEQ = 32
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
         "rho sigma tau upsilon phi chi psi omega").split()


def text(rng: random.Random, n_words: int) -> str:
  return " ".join(rng.choice(WORDS) for _ in range(n_words)) + f" #{rng.random():.12f}\n"


def data_config(path: Path, **kw):
  c = base_config().data
  c.update(dict(name="prepared", path=str(path), tokenizer="byte", seq_len=SEQ), **kw)
  return c
