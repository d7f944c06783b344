"""The config schema (one ConfigDict for model, data, training, mesh) and its validation.

Every program calls `validate(config)` before doing any work; a bad value raises ConfigError with
one line naming the field and the constraint.
"""
from __future__ import annotations

import math

import ml_collections

from diff_transformer import kernels
from diff_transformer.data import synthetic
from diff_transformer.data.synthetic import task_spec
from diff_transformer.errors import ConfigError
from diff_transformer.model.attention import (model_section, other_sections_changed, section,
                                              spec_from_config, variant_class)

KERNELS = ("auto", *kernels.KERNELS)  # auto: kernels/auto.py picks one per platform and shapes
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
LAYER_LOOPS = ("auto", "scan", "unroll")
DTYPES = ("float32", "bfloat16")
MAX_SEQ_LEN = 1 << 20  # a million positions: 16x the papers' longest (64K)


def ffn_width(d_model: int, multiple: int = 128, up: bool = False) -> int:
  """SwiGLU width 8/3 * D rounded to the nearest multiple of 128 (exact for D = 3072 and 2880),
  or with up=True rounded up (the CPU sweep: up to a multiple of 64)."""
  if up:
    return -(-8 * d_model // (3 * multiple)) * multiple
  return int(round(8 * d_model / 3 / multiple)) * multiple


def model_config() -> ml_collections.ConfigDict:
  """The model section: the keys every variant has (model/spec.py) and each variant's own (its
  Options, model/attention/), with their defaults and meaning."""
  return model_section()


def task_config() -> ml_collections.ConfigDict:
  """Synthetic task parameters (data.name = mqar | needle; data/synthetic.py)."""
  return ml_collections.ConfigDict(dict(
      # ids the task uses (<= model.vocab_size); pools split what is left of 4 specials
      vocab_size=256,
      compositional=True,  # mqar: two-token keys on a g x g grid (False: plain single-token keys)
      num_keys=4,  # mqar: g (g*g stored pairs) when compositional, else the stored pairs
      num_queries=8,  # mqar: stored pairs asked per row (a strict subset)
      query_power=0.1,  # mqar: query slot i drawn with weight (i + 1)^(power - 1) (Zoology's gaps)
      needles=4,  # needle: real needles per row
      asked=2,  # needle: needles asked at the end
      distractors=0,  # needle: extra needles taking ka and kb of two different asked needles
      depth_min=0.0,  # needle: needles start within this fraction band of the haystack
      depth_max=1.0,
      # needle: haystack ids ("random": the filler pool); mqar: query-region filler ("random":
      # key-pool ids, "blank": the one BLANK id)
      filler="random",
      heldout_buckets=16,  # 1 / this of the content-hash space is the eval split
  ))


def base_config() -> ml_collections.ConfigDict:
  """All fields with defaults; presets change values, never add keys."""
  c = ml_collections.ConfigDict()
  c.model = model_config()
  c.data = ml_collections.ConfigDict(dict(
      # built-in corpus "shakespeare", "prepared" (`path` from prepare_data.py), or a synthetic
      # task "mqar" / "needle" (parameters in data.task)
      name="shakespeare",
      path="",  # directory written by prepare_data.py (name="prepared")
      tokenizer="bpe",  # bpe (trained offline on the corpus) or byte
      bpe_vocab_size=8192,
      cache_dir="",  # default $DIFF_TRANSFORMER_CACHE or ~/.cache/diff_transformer
      seq_len=256,
      packing="concat",  # concat (full rows) or first_fit (whole documents, padded)
      # True: a packed row's documents attend within themselves, positions restarting at each;
      # False: causal over the whole row, positions 0..T-1 across documents, as the DIFF paper
      # trains (FlashAttention with causal=True over concatenated documents). Text only.
      document_mask=True,
      seed=0,
      val_fraction=0.05,
  ))
  c.data.task = task_config()
  c.train = ml_collections.ConfigDict(dict(
      steps=1000,
      global_batch_size=32,
      micro_batches=1,  # gradient accumulation
      lr=1e-3,
      final_lr=1e-4,
      warmup_steps=50,
      b1=0.9,
      b2=0.98,
      eps=1e-8,
      weight_decay=0.05,
      # Weight decay by a parameter's declared role (model/roles.py), never its name: weights
      # always; norm gains, lambdas and the embedding table as these say.
      decay_norms=False,
      decay_lambda=False,
      decay_embeddings=True,
      grad_clip=1.0,
      z_loss=0.0,
      seed=0,
      log_every=10,
      eval_every=200,
      eval_batches=8,
      checkpoint_every=200,
      max_to_keep=3,
      # Stop when a step's loss exceeds this many times the running mean of the losses before
      # it (as with a non-finite loss, checkpoints that led to it are set aside); 0 = off.
      max_loss_spike=0.0,
      # Stop (saving, and writing the run's summary as a finished run) at the first evaluation whose
      # validation accuracy reaches this level; 0 = off. Studies timing steps to a level use it.
      stop_at_val_accuracy=0.0,
      peak_tflops=0.0,  # per-device peak for MFU; 0 = look up the device kind
      # GPU: XLA's deterministic ops (--xla_gpu_deterministic_ops, which also governs the cuDNN
      # attention backward XLA runs; jax's cuDNN entry has no switch of its own), so a resumed
      # run can repeat bit for bit at some cost. Set before the backend starts (train.py).
      deterministic=False,
  ))
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  c.source = ""  # where the numbers come from and where they deviate
  # A Hugging Face folder (LlamaForCausalLM / DiffLlamaForCausalLM or an export of this codebase)
  # whose weights a new run starts from; saved as checkpoint step 0. Needs the hf extra.
  c.init_from_hf = ""
  return c


def _fail(field: str, constraint: str) -> None:
  raise ConfigError(f"{field}: {constraint}")


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Checks every constraint the model and trainer rely on; returns the config."""
  attention = variant_class(config.model.variant)  # first: a module:Class is imported
  _check_keys(config, base_config(), "")
  _check_finite(config, "")
  m = config.model
  kernels.cudnn.forced_layout()  # DIFF_TRANSFORMER_CUDNN_LAYOUT, checked before any work
  if m.kernel not in KERNELS:
    _fail("model.kernel", f"unknown kernel '{m.kernel}'; choose one of {', '.join(KERNELS)}")
  if m.remat not in REMAT_POLICIES:
    _fail("model.remat", f"unknown policy '{m.remat}'; choose one of {', '.join(REMAT_POLICIES)}")
  if m.layer_loop not in LAYER_LOOPS:
    _fail("model.layer_loop", f"'{m.layer_loop}' is not one of {', '.join(LAYER_LOOPS)}")
  if m.dtype not in DTYPES:
    _fail("model.dtype", f"'{m.dtype}' is not one of {', '.join(DTYPES)}")
  for name in ("vocab_size", "d_model", "num_layers", "num_heads", "head_dim", "ffn_dim",
               "max_seq_len", "max_segments"):
    if m[name] is None or m[name] <= 0:
      _fail(f"model.{name}", f"must be a positive integer, got {m[name]}")
  if m.max_seq_len > MAX_SEQ_LEN:  # position tables and eval inputs are this long
    _fail("model.max_seq_len", f"must be <= {MAX_SEQ_LEN}, got {m.max_seq_len}")
  if m.vocab_multiple is None or m.vocab_multiple < 0:
    _fail("model.vocab_multiple", f"must be >= 0 (0 = vocab_size as given), got "
          f"{m.vocab_multiple}")
  spec = spec_from_config(m)
  if spec.kv_heads <= 0:
    _fail("model.num_kv_heads", f"must be a positive integer, got {spec.kv_heads}")
  query_heads = attention.query_heads(spec)
  if query_heads % spec.kv_heads:
    _fail("model.num_kv_heads", f"{spec.kv_heads} kv heads do not divide {query_heads} query "
          "heads")
  spec.options.check(f"model.{section(spec.variant)}")  # the variant's own keys
  ignored = other_sections_changed(m)
  if ignored:
    _fail(ignored, f"an option of {ignored.split('.')[1]}, not of {spec.variant} (a run reads "
          f"model.{spec.variant}.* alone; leave it at its default)")
  attention.check(spec)
  if m.rope_pairs not in ("interleaved", "half"):
    _fail("model.rope_pairs", f"'{m.rope_pairs}' is not one of interleaved, half")
  if m.short_conv < 0:
    _fail("model.short_conv", f"must be >= 0 (0 = off), got {m.short_conv}")
  d, t = config.data, config.train
  if d.name in synthetic.TASKS:
    if d.task.vocab_size > m.vocab_size:
      _fail("data.task.vocab_size", f"{d.task.vocab_size} exceeds model.vocab_size = "
            f"{m.vocab_size}")
    try:
      task_spec(d)
    except ValueError as e:
      raise ConfigError(str(e)) from None
  if d.seq_len <= 0 or d.seq_len > m.max_seq_len:
    _fail("data.seq_len", f"must be in [1, model.max_seq_len = {m.max_seq_len}], got {d.seq_len}")
  if t.steps == 0 and config.init_from_hf:
    pass  # import only: write checkpoint step 0 (for eval.py) and stop
  elif t.steps <= 0:
    _fail("train.steps", f"must be a positive integer (0 only with init_from_hf), got {t.steps}")
  for name in ("global_batch_size", "micro_batches"):
    if t[name] <= 0:
      _fail(f"train.{name}", f"must be a positive integer, got {t[name]}")
  if t.global_batch_size % t.micro_batches:
    _fail("train.micro_batches", f"{t.micro_batches} does not divide global_batch_size "
          f"{t.global_batch_size}")
  if t.lr <= 0 or t.final_lr < 0:
    _fail("train.lr", f"lr must be > 0 and final_lr >= 0, got {t.lr}, {t.final_lr}")
  if t.max_loss_spike != 0 and not t.max_loss_spike > 1:
    _fail("train.max_loss_spike", f"must be 0 (off) or a factor > 1, got {t.max_loss_spike}")
  if not 0.0 <= t.stop_at_val_accuracy <= 1.0:
    _fail("train.stop_at_val_accuracy", f"must be in [0, 1] (0 = off), got "
          f"{t.stop_at_val_accuracy}")
  for axis in ("data", "fsdp", "tensor"):
    if config.mesh[axis] == 0 or config.mesh[axis] < -1:
      _fail(f"mesh.{axis}", f"must be a positive size or -1 (the remaining devices), got "
            f"{config.mesh[axis]}")
  return config


def _check_finite(config, prefix: str) -> None:
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      _check_finite(value, f"{prefix}{key}.")
    elif isinstance(value, float) and not math.isfinite(value):
      _fail(f"{prefix}{key}", f"must be a finite number, got {value}")


def _check_keys(config, schema, prefix: str) -> None:
  for key in config.keys():
    if key not in schema:
      _fail(f"{prefix}{key}", f"unknown key; known keys here: {', '.join(sorted(schema.keys()))}")
    if isinstance(schema[key], ml_collections.ConfigDict):
      _check_keys(config[key], schema[key], f"{prefix}{key}.")
