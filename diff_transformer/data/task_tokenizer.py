"""The synthetic tasks' id layout as a tokenizer: ids print as names, and a checkpoint records the
layout (its checksum) like any other tokenizer."""
from __future__ import annotations

import hashlib
import json

from diff_transformer.data.synthetic import BLANK, NEEDLE, PAD, QUERY, TaskSpec


class TaskTokenizer:
  """The task's id layout as a tokenizer (ids print as names; checkpoints record the layout)."""
  name = "synthetic"

  def __init__(self, spec: TaskSpec):
    self.spec = spec
    self.vocab_size = spec.vocab_size
    self.eot_id = PAD
    layout = json.dumps(dict(spec.describe(), seq_len=None), sort_keys=True)
    self.checksum = hashlib.sha256(layout.encode()).hexdigest()

  def encode(self, text: str) -> list[int]:
    return [int(t.lstrip("#")) for t in text.split()]

  def encode_batch(self, texts):
    return [self.encode(t) for t in texts]

  def decode(self, ids) -> str:
    names = {PAD: "<pad>", BLANK: "_", NEEDLE: "NEEDLE", QUERY: "QUERY"}
    return " ".join(names.get(int(i), f"#{int(i)}") for i in ids)
