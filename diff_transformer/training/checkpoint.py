"""Orbax checkpoints of model + optimizer + grain iterator, the run record, and restore helpers.

Layout of a workdir:
  config.json               the run's full config (written at start; resumes must keep its model)
  tokenizer_record.json     name, vocab size, eot id and sha256 of the tokenizer the run uses,
                            and vocab_padding (model rows beyond its ids)
  tokenizer.json            a copy of the tokenizer file (bpe and file runs; tiktoken runs keep
                            tokenizer.tiktoken + tiktoken.json)
  checkpoints/<step>/       orbax items: model, optimizer, data (grain state), meta (json)
  corrupt_checkpoints/      unreadable checkpoints moved aside when an older one was usable

Each checkpoint's meta records an exact, sharding-independent digest of its model and optimizer
arrays; a restore whose arrays do not reproduce it is treated as corrupted, so a damaged file
can never be trained from silently.
"""
from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp

from diff_transformer.config import base_config, validate
from diff_transformer.data import assert_compatible, describe
from diff_transformer.data.tokenizer import load_tokenizer
from diff_transformer.errors import DataError, TrainError, last_line, message_lines, read_json
from diff_transformer.training.mesh import make_mesh
from diff_transformer.training.step import State, Trainer, fingerprint

CONFIG_FILE = "config.json"
TOKENIZER_RECORD = "tokenizer_record.json"
TOKENIZER_COPY = "tokenizer.json"
TOKENIZER_FILES = (TOKENIZER_COPY, "tokenizer.tiktoken", "tiktoken.json")  # copied into the run


def _one_line(e: BaseException) -> str:
  lines = message_lines(e)
  first = lines[0].split(" See full TensorStore details")[0][:200] if lines else ""
  return f"{type(e).__name__}: {first}" if first else type(e).__name__


@contextlib.contextmanager
def _quiet_failed_reads():
  """A failed orbax read leaves tensorstore reads in flight whose callbacks hit a closed event
  loop and print tracebacks from background threads (and coroutines Python would report as
  'Exception ignored'). The failure is already reported in one line, so while restoring (and
  briefly after a failure, for stragglers) that stderr noise is captured and dropped."""
  old_hook = sys.unraisablehook
  sys.unraisablehook = lambda unraisable: None
  try:
    with contextlib.redirect_stderr(io.StringIO()):
      yield
  finally:
    sys.unraisablehook = old_hook


def _settle_failed_reads() -> None:
  time.sleep(1.0)  # the sibling reads of a failed restore finish within milliseconds locally
  gc.collect()
  # Their orphaned asyncio tasks are otherwise logged as 'Task exception was never retrieved'
  # with a traceback whenever they are collected, possibly at exit.
  logging.getLogger("asyncio").setLevel(logging.CRITICAL)


# ---- the run record ------------------------------------------------------------------------
def write_run_record(workdir: Path, config: ml_collections.ConfigDict, dataset) -> None:
  """Writes config.json and the tokenizer record (process 0 only)."""
  if jax.process_index() != 0:
    return
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / CONFIG_FILE).write_text(config.to_json_best_effort(indent=2) + "\n")
  record = describe(dataset.tokenizer)
  # Embedding rows beyond the tokenizer's ids (a preset's vocab rounded up, e.g. to 128): never
  # produced by the data, recorded so an export or a reader knows which ids are real.
  record["vocab_padding"] = int(config.model.vocab_size) - record["vocab_size"]
  (workdir / TOKENIZER_RECORD).write_text(json.dumps(record, indent=2) + "\n")
  for name in TOKENIZER_FILES:  # whichever the data's tokenizer keeps (bpe, file, tiktoken)
    source = Path(dataset.path) / name
    if record["name"] != "byte" and source.is_file():
      shutil.copyfile(source, workdir / name)


def read_config(workdir: Path) -> ml_collections.ConfigDict | None:
  path = Path(workdir) / CONFIG_FILE
  if not path.is_file():
    return None
  config = base_config()
  values = read_json(path, TrainError)
  if not isinstance(values, dict):
    raise TrainError(f"{path}: damaged (not a JSON object of config fields)")
  try:
    config.update_from_flattened_dict(_flatten(values))
  except (KeyError, AttributeError, TypeError, ValueError) as e:
    raise TrainError(f"{path}: damaged or from another version ({last_line(e)})") from None
  return config


def _flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def check_run_record(workdir: Path, config: ml_collections.ConfigDict, tokenizer
                     ) -> tuple[int, int] | None:
  """A resumed run must use the recorded tokenizer and the same model shape. Returns (recorded,
  new) train.global_batch_size when the resume changes it (allowed, and said), else None."""
  if (workdir / TOKENIZER_RECORD).is_file():
    check_tokenizer_record(workdir, tokenizer)
  recorded = read_config(workdir)
  if recorded is None:
    return None
  old, new = _flatten(recorded.model.to_dict()), _flatten(config.model.to_dict())
  for key in sorted(new):
    if old.get(key) != new[key]:
      raise TrainError(f"model.{key}: {workdir} holds a run with {old.get(key)!r}, this config "
                       f"has {new[key]!r}; use another --workdir or the recorded config")
  if recorded.train.global_batch_size == config.train.global_batch_size:
    return None
  return int(recorded.train.global_batch_size), int(config.train.global_batch_size)


def check_tokenizer_record(workdir: Path, tokenizer=None) -> dict:
  """The recorded tokenizer, checked against `tokenizer` or against the workdir's own copy."""
  path = Path(workdir) / TOKENIZER_RECORD
  if not path.is_file():
    raise TrainError(f"{path}: missing; {workdir} is not a training workdir")
  record = read_json(path, TrainError)
  if tokenizer is not None:
    assert_compatible(record, tokenizer)
  elif record.get("name") == "byte" or any((Path(workdir) / n).is_file()
                                           for n in TOKENIZER_FILES[:2]):
    load_tokenizer(record, workdir)  # raises DataError if the copy's checksum differs
  # A task's layout is checked with its data; file tokenizers against the data's own copy.
  elif record.get("name") not in ("bpe", "file", "tiktoken", "synthetic"):
    raise DataError(f"{path}: unknown tokenizer {record.get('name')!r}")
  return record


# ---- checkpoints -----------------------------------------------------------------------------
class _OrbaxErrorCatcher(logging.Filter):
  """Keeps the exceptions orbax logs (with tracebacks) from its save threads off stderr and
  remembers the last one, so a failed save is reported once, as one line, by check_saved()."""

  def __init__(self):
    super().__init__()
    self.last: BaseException | None = None

  def filter(self, record: logging.LogRecord) -> bool:
    if record.exc_info and "orbax" in record.pathname:
      self.last = record.exc_info[1]
      return False
    return True


def _split_state(state: State) -> tuple[dict, dict]:
  return (dict(params=state["params"], constants=state["constants"]),
          dict(step=state["step"], opt_state=state["opt_state"]))


class Checkpointer:
  """An orbax CheckpointManager over <workdir>/checkpoints with fallback on damaged steps."""

  def __init__(self, workdir: Path, train_config: ml_collections.ConfigDict | None = None,
               read_only: bool = False):
    self.workdir = Path(workdir).resolve()
    self.directory = self.workdir / "checkpoints"
    t = train_config
    self.options = ocp.CheckpointManagerOptions(
        max_to_keep=int(t.max_to_keep) if t else None,
        enable_async_checkpointing=not read_only, create=not read_only, read_only=read_only,
        cleanup_tmp_directories=not read_only)  # half-written temp dirs of killed runs go away
    self.manager = ocp.CheckpointManager(self.directory, options=self.options)
    self._pending: int | None = None  # the step of an async save not yet known to be committed
    self._failed = False  # orbax re-raises a failed save on every later wait: report it once
    self._errors = _OrbaxErrorCatcher()
    logging.getLogger("absl").addFilter(self._errors)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def committed_steps(self) -> list[int]:
    """Steps whose save finished (orbax renames a step's temp dir to <step> as its last act)."""
    if not self.directory.is_dir():
      return []
    return sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())

  def newest(self) -> str:
    """Which committed checkpoint a resume would start from, for one-line messages."""
    steps = self.committed_steps()
    return (f"the newest checkpoint is step {steps[-1]} in {self.directory}" if steps
            else f"there is no checkpoint in {self.directory} yet")

  def save(self, step: int, state: State, iterator) -> bool:
    """Starts an async save (returns once the arrays are copied off the devices); the caller
    decides when (train.checkpoint_every, the last step, a stop signal). A previous save that
    failed, or too little free space for this one, raises TrainError first."""
    self.check_saved(wait=True)
    self._check_free_space(step, state)
    model, optimizer = _split_state(state)
    meta = dict(step=int(step), model_digest=fingerprint(model),
                optimizer_digest=fingerprint(optimizer), time=time.time(),
                process_count=jax.process_count())
    items = dict(model=ocp.args.StandardSave(model), optimizer=ocp.args.StandardSave(optimizer),
                 meta=ocp.args.JsonSave(meta))
    if iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(iterator)
    self._pending, self._errors.last = step, None
    return self.manager.save(step, args=ocp.args.Composite(**items), force=True)

  def _check_free_space(self, step: int, state: State) -> None:
    """Refuses a save the file system has clearly no room for (a cheap statvfs, no writes)."""
    arrays = [x for x in jax.tree.leaves(state) if hasattr(x, "nbytes")]
    needed = sum(x.nbytes for x in arrays) / jax.process_count()
    self.directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(self.directory).free
    if free < needed * 1.1 + (1 << 20):  # a margin for orbax's metadata files
      raise TrainError(f"checkpoint step {step}: {self.directory} has {free / 1e6:.1f} MB free, "
                       f"the checkpoint needs about {needed / 1e6:.1f} MB; free some space "
                       f"(nothing was written; {self.newest()})")

  def check_saved(self, wait: bool = False) -> None:
    """Raises TrainError (one line) if the last async save failed, after removing its partial
    files; the checkpoints before it are untouched. Without `wait`, a save still running is
    left alone (so this is cheap to call every step)."""
    if self._pending is None or (not wait and self.manager.is_saving_in_progress()):
      return
    step, self._pending = self._pending, None
    error = None
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001 - orbax re-raises whatever the save thread hit
      error = e
    if error is None and (self.directory / str(step)).is_dir():
      return
    self._failed = True
    self._remove_partial(step)
    error = error or self._errors.last  # the save thread's exception, logged by orbax
    cause = _one_line(error) if error is not None else "it was not committed"
    raise TrainError(f"checkpoint step {step} could not be saved to {self.directory} ({cause}); "
                     f"removed its partial files; {self.newest()}")

  def _remove_partial(self, step: int) -> None:
    if jax.process_index() == 0:
      for path in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
        shutil.rmtree(path, ignore_errors=True)
      shutil.rmtree(self.directory / str(step), ignore_errors=True)
    self.manager.reload()

  def wait(self) -> None:
    self.check_saved(wait=True)

  def close(self) -> None:
    try:
      self.check_saved(wait=True)
      if self._failed:
        with contextlib.suppress(Exception):
          self.manager.close()
      else:
        self.manager.close()
    finally:
      logging.getLogger("absl").removeFilter(self._errors)

  def _restore_step(self, step: int, abstract: State, iterator, model_only: bool) -> dict:
    model, optimizer = _split_state(abstract)
    items = dict(model=ocp.args.StandardRestore(model), meta=ocp.args.JsonRestore())
    if not model_only:
      items["optimizer"] = ocp.args.StandardRestore(optimizer)
      if iterator is not None:
        items["data"] = grain.checkpoint.CheckpointRestore(iterator)
    restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    meta = restored["meta"]
    if fingerprint(restored["model"]) != meta["model_digest"]:
      raise TrainError("model arrays do not match the digest saved with them")
    if not model_only and fingerprint(restored["optimizer"]) != meta["optimizer_digest"]:
      raise TrainError("optimizer arrays do not match the digest saved with them")
    out = dict(restored["model"])
    if not model_only:
      out.update(restored["optimizer"])
    return out

  def restore(self, abstract: State, iterator=None, *, step: int | None = None,
              model_only: bool = False) -> tuple[dict, int] | None:
    """(state, step) from `step` or the newest readable checkpoint; None if there is none.

    A damaged newest checkpoint is reported in one line and moved to corrupt_checkpoints/ once
    an older one restored (nothing is deleted); if none restores, TrainError refuses to go on.
    """
    steps = sorted(self.manager.all_steps(), reverse=True)
    if step is not None:
      if step not in steps:
        raise TrainError(f"{self.directory}: no checkpoint for step {step} (have {steps})")
      steps = [step]
    failed: list[tuple[int, str]] = []
    for s in steps:
      try:
        with _quiet_failed_reads():
          try:
            state = self._restore_step(s, abstract, iterator, model_only)
          except Exception:
            _settle_failed_reads()
            raise
      except Exception as e:  # orbax/tensorstore raise many types for damaged files
        if isinstance(e, ValueError) and "tree structures do not match" in str(e):
          # Not damage: this config builds a state of another layout (e.g. another optimizer).
          raise TrainError(f"checkpoint step {s} in {self.directory} holds a state of another "
                           f"structure than this config builds ({_one_line(e)}); resume with "
                           "the recorded config.json or use another --workdir") from None
        failed.append((s, _one_line(e)))
        print(f"warning: checkpoint step {s} in {self.directory} is unreadable "
              f"({failed[-1][1]})", flush=True)
        continue
      if failed and not self.options.read_only:
        self.set_aside([f for f, _ in failed], "corrupt_checkpoints")
        print(f"warning: fell back to checkpoint step {s}; moved damaged steps "
              f"{[f for f, _ in failed]} to {self.workdir / 'corrupt_checkpoints'}", flush=True)
      return state, s
    if failed:
      raise TrainError(f"{self.directory}: no readable checkpoint (steps {[f for f, _ in failed]} "
                       f"all failed, newest: {failed[0][1]}); refusing to train from scratch over "
                       "them: move them away or use another --workdir")
    return None

  def set_aside(self, steps: list[int], folder: str) -> Path:
    """Moves checkpoints out of reach of resume into <workdir>/<folder> (nothing is deleted)."""
    target = self.workdir / folder
    if jax.process_index() == 0:
      target.mkdir(exist_ok=True)
      for s in steps:
        src = self.directory / str(s)
        if src.exists():
          src.rename(target / f"{s}-{int(time.time())}")
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices("set_aside_checkpoints")
    self.manager.reload()
    return target


def restore_model(workdir: str | Path, step: int | None = None,
                  mesh: jax.sharding.Mesh | None = None, tokenizer=None
                  ) -> tuple[Any, ml_collections.ConfigDict, int]:
  """(model, config, step): the model of a training workdir, restored onto `mesh`.

  Only the model arrays are read (never the optimizer), straight into the target shardings of
  `mesh` (default: one device). The tokenizer record is checked against `tokenizer` when given,
  otherwise against the workdir's own tokenizer copy. Uses the newest readable checkpoint unless
  `step` is given.
  """
  workdir = Path(workdir)
  config = read_config(workdir)
  if config is None:
    raise TrainError(f"{workdir / CONFIG_FILE}: missing; {workdir} is not a training workdir")
  validate(config)
  check_tokenizer_record(workdir, tokenizer)
  if mesh is None:
    mesh = make_mesh(ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1)),
                     devices=jax.devices()[:1])
  trainer = Trainer(config, mesh)
  found = Checkpointer(workdir, read_only=True).restore(trainer.abstract_state, step=step,
                                                          model_only=True)
  if found is None:
    raise TrainError(f"{workdir / 'checkpoints'}: no checkpoint to restore")
  state, step = found
  return trainer.model(state), config, step
