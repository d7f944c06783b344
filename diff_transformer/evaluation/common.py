"""What every suite shares: one-line errors, jitted model calls, JSON output, plotting, settings."""
from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from diff_transformer.errors import EvalError
from diff_transformer.model.attention import Attention
from diff_transformer.paths import write_atomic
from diff_transformer.model.nll import token_nll

Array = jax.Array


SUITES = ("task", "loss", "long_context", "needle", "attention", "outliers", "quantization", "icl",
          "generate")  # also the order of the report's sections
# What a run trained on a synthetic task can be asked (its data has no text).
TASK_SUITES = ("task", "attention", "loss", "outliers")


@dataclasses.dataclass
class Settings:
  """Suite sizes; `for_mode(quick=True)` runs every suite in a couple of CPU minutes (default
  run)."""
  quick: bool = False
  seed: int = 0
  batch_size: int = 8  # rows per forward pass (loss, outliers, needle and ICL prompts)
  val_batches: int = 0  # 0 = the whole validation split
  context_len: int = 0  # long_context / loss context; 0 = model.max_seq_len
  ar_hit_context: int = 1  # loss: tokens before a target in an AR-hit n-gram (1: the bigram)
  long_docs: int = 16  # longest held-out documents for long_context
  needle_lengths: tuple[int, ...] = ()  # () = (max_seq_len // 2, max_seq_len)
  needle_configs: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (4, 2), (6, 2))  # (N, R)
  needle_samples: int = 50
  depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
  attention_samples: int = 8  # needle prompts per depth for the attention suite
  quant_bits: tuple[int, ...] = (16, 8, 6, 4)
  quant_val_batches: int = 8
  quant_needle_samples: int = 10
  icl_data: str = ""  # users' JSONL (text, label); "" = the built-in task
  icl_test: int = 64
  icl_permutations: int = 5
  icl_classes: int = 4
  prompt: str = ""  # generate: "" = openings of held-out documents
  max_new_tokens: int = 64
  temperature: float = 0.8
  top_k: int = 40
  task_rows: int = 512  # eval-split rows per task slice
  task_attention_rows: int = 32  # rows for the attention suite on a synthetic task

  @classmethod
  def for_mode(cls, quick: bool, **overrides) -> "Settings":
    base = cls(quick=True, val_batches=4, long_docs=4, needle_configs=((1, 1), (4, 2)),
               needle_samples=2, attention_samples=2, quant_val_batches=2,
               quant_needle_samples=2, icl_test=16, icl_permutations=3, max_new_tokens=24,
               task_rows=128, task_attention_rows=8
               ) if quick else cls()
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


def check_context(model, length: int, what: str) -> int:
  """A context length the model can take, or one clear line saying why not."""
  limit = model.spec.max_seq_len
  if length > limit:
    raise EvalError(f"{what}: context length {length} exceeds the model's max_seq_len {limit}")
  if length <= 0:
    raise EvalError(f"{what}: context length must be positive, got {length}")
  return length


class Fns:
  """Jitted calls of one model (split once; a new graph, e.g. quantised logits, gets new Fns)."""

  def __init__(self, model):
    self.model = model
    self.spec = model.spec
    self.graphdef, self.state = nnx.split(model)
    graphdef = self.graphdef

    def logits(state, tokens, positions, segment_ids):
      return nnx.merge(graphdef, state)(tokens, positions, segment_ids)

    def capture(state, tokens, positions, segment_ids):
      return nnx.merge(graphdef, state)(tokens, positions, segment_ids, capture=True)

    def decode(state, tokens, cache, lengths):
      return nnx.merge(graphdef, state).decode(tokens, cache, lengths)

    def prefill(state, tokens, max_len, lengths):
      return nnx.merge(graphdef, state).prefill(tokens, max_len, lengths)

    def nll(state, tokens, targets, positions, segment_ids):
      return token_nll(nnx.merge(graphdef, state)(tokens, positions, segment_ids), targets)

    def layer_project(state, i, x, positions):
      return _block(graphdef, state, i).attn.project(x, positions)

    def layer_output(state, i, x, positions, segment_ids):
      return _block(graphdef, state, i)(x, positions, segment_ids)[0]

    self._logits = jax.jit(logits)
    self._capture = jax.jit(capture)
    self._decode = jax.jit(decode)
    # A caller that keeps only the returned cache (token-by-token generation) hands its cache
    # over, so the step writes its entries in place instead of copying the whole cache.
    self._decode_in_place = jax.jit(decode, donate_argnums=2)
    self._prefill = jax.jit(prefill, static_argnums=2)
    self._nll = jax.jit(nll)
    self._layer_project = jax.jit(layer_project)
    self._layer_output = jax.jit(layer_output)

  def reloaded(self, model) -> "Fns":
    """These compiled calls on another model of the same graph (another init seed, another
    checkpoint): nothing compiles again."""
    graphdef, state = nnx.split(model)
    if graphdef != self.graphdef:
      raise ValueError("Fns.reloaded: the model's graph differs from the compiled one")
    other = copy.copy(self)
    other.model, other.state = model, state
    return other

  def logits(self, tokens, positions=None, segment_ids=None) -> Array:
    return self._logits(self.state, jnp.asarray(tokens), _opt(positions), _opt(segment_ids))

  def capture(self, tokens, positions=None, segment_ids=None):
    return self._capture(self.state, jnp.asarray(tokens), _opt(positions), _opt(segment_ids))

  def nll(self, tokens, targets, positions=None, segment_ids=None) -> np.ndarray:
    """Per-token negative log-likelihood (float32 [B, T]) of `targets`."""
    return np.asarray(self._nll(self.state, jnp.asarray(tokens), jnp.asarray(targets),
                                _opt(positions), _opt(segment_ids)))

  def prefill(self, tokens, max_len: int, lengths=None):
    """(logits, a new cache of `max_len` positions holding the prompts): Decoder.prefill."""
    return self._prefill(self.state, jnp.asarray(tokens, jnp.int32), max_len, _opt(lengths))

  def decode(self, tokens, cache, lengths=None, *, in_place: bool = False):
    """`in_place`: `cache` is consumed (unusable after the call); keep the returned one."""
    step = self._decode_in_place if in_place else self._decode
    return step(self.state, jnp.asarray(tokens, jnp.int32), cache, _opt(lengths))

  def layer_project(self, i: int, x, positions):
    """Block i's attention inputs (a Projected: q1, k1, v, ...) from its attention input x."""
    return self._layer_project(self.state, i, x, jnp.asarray(positions))

  def layer_output(self, i: int, x, positions, segment_ids):
    """Block i's output (the residual stream after it) from its input x."""
    return self._layer_output(self.state, i, x, jnp.asarray(positions), jnp.asarray(segment_ids))


def _block(graphdef, state, i):
  """Block i of the model's stacked layers as a plain module (i may be traced: one program
  serves every layer)."""
  blocks_graphdef, blocks_state = nnx.split(nnx.merge(graphdef, state).blocks)
  return nnx.merge(blocks_graphdef, jax.tree.map(lambda x: x[i], blocks_state))


def _opt(x):
  return None if x is None else jnp.asarray(x)


def with_logit_bits(model, bits: int | None):
  """A copy of `model` whose attention quantises its logits to `bits` bits (reference kernel)."""
  graphdef, state = nnx.split(model)
  copy = nnx.merge(graphdef, state)
  for _, module in nnx.iter_modules(copy):
    if isinstance(module, Attention):
      module.logit_bits = bits
      module.kernel = "reference"
  return copy


def pad_rows(rows: list[list[int]], length: int | None = None, multiple: int = 32,
             limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded int32 [B, T] (T rounded up to `multiple`, capped at `limit`) and lengths."""
  longest = max(len(r) for r in rows)
  if length is None:
    length = int(math.ceil(longest / multiple) * multiple)
    if limit is not None:
      length = min(length, max(limit, longest))
  out = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out, np.asarray([len(r) for r in rows], np.int32)


def batched(items: list, size: int):
  for i in range(0, len(items), size):
    yield items[i:i + size]


def write_json(out_dir: Path, name: str, obj: dict) -> Path:
  out_dir.mkdir(parents=True, exist_ok=True)
  return write_atomic(out_dir / f"{name}.json", json.dumps(obj, indent=2, default=_jsonable) + "\n")


def _jsonable(x):
  if isinstance(x, (np.floating, np.integer)):
    return x.item()
  if isinstance(x, (np.ndarray, jax.Array)):
    return np.asarray(x).tolist()
  raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def pyplot():
  """matplotlib.pyplot on the Agg backend (files only, no display needed)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def figure(ncols: int = 1, size=(5, 3.2)):
  """(fig, axes) with constrained layout; axes is one Axes, or a list when ncols > 1."""
  fig, axes = pyplot().subplots(1, ncols, figsize=size, layout="constrained", squeeze=False)
  return fig, (axes[0, 0] if ncols == 1 else list(axes[0]))


def save_figure(fig, path: Path) -> str:
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  pyplot().close(fig)
  return path.name
