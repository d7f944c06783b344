"""The `diff_transformer` lm-eval model: loglikelihood (with is_greedy), rolling loglikelihood in
max-length windows (lm-eval's own window rule, as its HF model uses), and generate_until with the
KV cache, stop sequences, max_gen_toks and seeded sampling (do_sample, temperature, top_k, top_p);
requests are scored in batches.
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import lm_eval.models  # noqa: F401  (lm-eval's own models register only into an empty registry)
from flax import nnx
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from diff_transformer.data.tokenizer import load_tokenizer
from diff_transformer.evaluation import decoding
from diff_transformer.errors import UserError
from diff_transformer.evaluation.common import Fns, pad_rows
from diff_transformer.files import read_json
from diff_transformer.runs.folder import TOKENIZER_RECORD
from diff_transformer.runs.restore import restore_model
from diff_transformer.mesh import batch_sharding, data_parallel_size, make_mesh

LENGTH_BUCKET = 64  # rows are padded to a multiple of this (fewer compiled shapes)


def _score_fn(graphdef):
  """Jitted (tokens, targets) -> (log p(target) [B, T], target is the argmax [B, T])."""
  def score(state, tokens, targets):
    logits = nnx.merge(graphdef, state)(tokens).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return picked, jnp.argmax(logits, axis=-1) == targets
  return jax.jit(score)


@register_model("diff_transformer")
class DiffTransformerLM(TemplateLM):
  """A training run's checkpoint behind lm-eval's model interface, restored onto every local
  device (parameters replicated, each scoring batch split over the devices by rows)."""

  def __init__(self, workdir: str, step: int | str | None = None, batch_size: int | str = 8,
               max_gen_toks: int | str = 256, max_length: int | str | None = None,
               seed: int | str = 0, **kwargs):
    super().__init__()
    self.workdir = Path(workdir)
    step = None if step in (None, "") else int(step)
    mesh = make_mesh(ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1)),
                     devices=jax.local_devices())
    model, _, self.step = restore_model(self.workdir, step=step, mesh=mesh)
    self.rows_sharding, self.data_parallel = batch_sharding(mesh), data_parallel_size(mesh)
    self.fns = Fns(model)
    self.spec = model.spec
    record = read_json(self.workdir / TOKENIZER_RECORD, UserError, "tokenizer record")
    self.tok = load_tokenizer(record, self.workdir)
    self.batch_size = int(batch_size) if str(batch_size) != "auto" else 8
    self._max_gen_toks = int(max_gen_toks)
    self.seed = int(seed)  # of sampled generation (gen_kwargs do_sample)
    self._max_length = int(max_length) if max_length else self.spec.max_seq_len
    self._score = _score_fn(self.fns.graphdef)

  @classmethod
  def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
    """--model_args win over lm-eval's own --batch_size/--device (given to every model)."""
    return cls.create_from_arg_obj(lm_utils.simple_parse_args_string(arg_string),
                                   additional_config)

  @classmethod
  def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
    extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
    return cls(**{**extra, **arg_dict})

  # ---- tokenizer side ----------------------------------------------------------------------
  @property
  def eot_token_id(self) -> int:
    return int(self.tok.eot_id)

  @property
  def max_length(self) -> int:
    return self._max_length

  @property
  def max_gen_toks(self) -> int:
    return self._max_gen_toks

  @property
  def tokenizer_name(self) -> str:
    return f"diff_transformer-{self.tok.name}-{self.tok.checksum[:12]}"

  def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
    return list(self.tok.encode(string))

  def tok_decode(self, ids) -> str:
    return self.tok.decode(ids)

  # ---- scoring ------------------------------------------------------------------------------
  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
    """(sum log p(continuation | context), greedy) per ((ctx, cont), ctx ids, cont ids)."""
    rows, spans = [], []
    for _, context_enc, continuation_enc in requests:
      whole = (list(context_enc) + list(continuation_enc))[-(self.max_length + 1):]
      rows.append(whole)
      spans.append(len(continuation_enc))
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))  # similar lengths per batch
    results: list[tuple[float, bool] | None] = [None] * len(rows)
    for start in tqdm(range(0, len(order), self.batch_size), disable=disable_tqdm,
                      desc="diff_transformer loglikelihood"):
      idx = order[start:start + self.batch_size]
      fill = -len(idx) % self.data_parallel  # rows split evenly over the devices
      inputs = [rows[i][:-1] for i in idx + idx[:1] * fill]
      targets = [rows[i][1:] for i in idx + idx[:1] * fill]
      tokens, lengths = pad_rows(inputs, multiple=LENGTH_BUCKET, limit=self.max_length)
      target_ids, _ = pad_rows(targets, length=tokens.shape[1])
      put = lambda x: jax.device_put(x, self.rows_sharding)
      logp, greedy = (np.asarray(x) for x in self._score(self.fns.state, put(tokens),
                                                          put(target_ids)))
      for row, i in enumerate(idx):
        end, n = int(lengths[row]), spans[i]
        results[i] = (float(logp[row, end - n:end].astype(np.float64).sum()),
                      bool(greedy[row, end - n:end].all()))
    for (request, _, _), result in zip(requests, results):
      if request is not None:
        self.cache_hook.add_partial("loglikelihood", request, result)
    return results

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    """Sum of log p over each document, in windows of max_length tokens (lm-eval's rule: every
    token is predicted once, each window conditioned on up to max_length preceding tokens)."""
    windows, owner = [], []
    for i, (text,) in enumerate(req.args for req in requests):
      for window in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
          token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
          max_seq_len=self.max_length, context_len=1)):
        windows.append((None, *window))
        owner.append(i)
    scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
    totals = [0.0] * len(requests)
    for i, (logp, _) in zip(owner, scores):
      totals[i] += logp
    for req, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
    return totals

  # ---- generation ---------------------------------------------------------------------------
  def _sampling(self, gen_kwargs: dict) -> dict:
    """decoding.generate's settings from lm-eval's gen_kwargs, as lm-eval's `hf` model reads
    them: sampling only with do_sample true (temperature default 1.0, 0 = greedy), else greedy."""
    do_sample = str(gen_kwargs.get("do_sample", False)).lower() in ("true", "1")
    temperature = float(gen_kwargs.get("temperature", 1.0)) if do_sample else 0.0
    top_k, top_p = int(gen_kwargs.get("top_k", 0)), float(gen_kwargs.get("top_p", 1.0))
    decoding.check_sampling(temperature=temperature, top_k=top_k, top_p=top_p,
                            field="generation_kwargs")  # before any decoding
    return dict(temperature=temperature, top_k=top_k, top_p=top_p)

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    """Continuations with the KV cache (greedy, or sampled when gen_kwargs say do_sample), cut
    at the first stop sequence or end-of-text. Sampling is seeded by `seed` (model_args), the
    batch and the settings, so the same requests and batch size give the same texts."""
    out: list[str] = []
    for start in tqdm(range(0, len(requests), self.batch_size), disable=disable_tqdm,
                      desc="diff_transformer generate_until"):
      batch = [r.args for r in requests[start:start + self.batch_size]]
      by_kwargs: dict[str, list[int]] = {}
      for j, (_, gen_kwargs) in enumerate(batch):  # one decode call per distinct setting
        by_kwargs.setdefault(json.dumps(gen_kwargs, sort_keys=True, default=str), []).append(j)
      texts: dict[int, str] = {}
      for members in by_kwargs.values():
        gen_kwargs = dict(batch[members[0]][1])
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        new = int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))
        new = min(new, self.max_length - 1)
        prompts = [(self.tok_encode(batch[j][0]) or [self.eot_token_id])[-(self.max_length - new):]
                   for j in members]
        sampling = self._sampling(gen_kwargs)
        seed = zlib.crc32(f"{self.seed} {start} {sorted(sampling.items())}".encode())  # stable
        generated = decoding.generate(self.fns, prompts, new, seed=seed,
                                      num_ids=self.tok.vocab_size, **sampling)
        for j, ids in zip(members, generated):
          if self.eot_token_id in ids:
            ids = ids[:ids.index(self.eot_token_id)]
          text = self.tok_decode(ids)
          for stop in until:
            if stop and stop in text:
              text = text[:text.index(stop)]
          texts[j] = text
          self.cache_hook.add_partial("generate_until", batch[j], text)
      out.extend(texts[j] for j in range(len(batch)))
    return out
