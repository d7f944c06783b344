"""Orbax checkpoints of model + optimizer + grain iterator, with fallback on damaged steps.

  RunFolder.checkpoints/<step>/     orbax items: model, optimizer, data (grain state), meta (json)
  RunFolder.corrupt_checkpoints     unreadable checkpoints moved aside when an older one was usable

Each checkpoint's meta records an exact, sharding-independent digest of its model and optimizer
arrays; a restore whose arrays do not reproduce it is treated as corrupted, so a damaged file
can never be trained from silently.
"""
from __future__ import annotations

import contextlib
import logging
import shutil
import time
from pathlib import Path

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp

from diff_transformer.runs import folder as run_folder
from diff_transformer.errors import Stopped, TrainError
from diff_transformer.runs.folder import RunFolder
from diff_transformer.runs.orbax_errors import (OrbaxErrorCatcher, one_line,
                                                    quiet_failed_reads, settle_failed_reads)
from diff_transformer.runs.layout import State, fingerprint


def _split_state(state: State) -> tuple[dict, dict | None]:
  """(the model half, the optimizer half or None for a model-only state)."""
  model = dict(params=state["params"], constants=state["constants"])
  if "opt_state" not in state:
    return model, None
  return model, dict(step=state["step"], opt_state=state["opt_state"])


class Checkpointer:
  """An orbax CheckpointManager over <workdir>/checkpoints with fallback on damaged steps."""

  def __init__(self, workdir: Path, train_config: ml_collections.ConfigDict | None = None,
               read_only: bool = False):
    self.workdir = Path(workdir).resolve()
    self.directory = RunFolder(self.workdir).checkpoints
    t = train_config
    self.options = ocp.CheckpointManagerOptions(
        max_to_keep=int(t.max_to_keep) if t else None,
        enable_async_checkpointing=not read_only, create=not read_only, read_only=read_only,
        cleanup_tmp_directories=not read_only)  # half-written temp dirs of killed runs go away
    self.manager = self._open()
    self._pending: int | None = None  # the step of an async save not yet known to be committed
    self._failed = False  # orbax re-raises a failed save on every later wait: report it once
    self._errors = OrbaxErrorCatcher()
    logging.getLogger("absl").addFilter(self._errors)

  def _open(self) -> ocp.CheckpointManager:
    """The orbax manager. A reader lists the steps while the run that trains there may delete
    old ones (max_to_keep): a step that vanishes while listed (orbax sees it missing, or sees its
    name but no longer a directory) is listed again, and a listing that keeps changing is one
    line."""
    for _ in range(20):
      try:
        return ocp.CheckpointManager(self.directory, options=self.options)
      except (FileNotFoundError, NotADirectoryError) as e:
        if not self.options.read_only:
          raise
        vanished = e
        time.sleep(0.05)
    raise TrainError(f"{self.directory}: its checkpoints kept changing while being listed "
                     f"({one_line(vanished)}); a run is saving there: try again")

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def committed_steps(self) -> list[int]:
    """Steps whose save finished (orbax renames a step's temp dir to <step> as its last act)."""
    return RunFolder(self.workdir).checkpoint_steps()

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
    error: BaseException | None = None
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001 - orbax re-raises whatever the save thread hit
      error = e
    if error is None and (self.directory / str(step)).is_dir():
      return
    self._failed = True
    self._remove_partial(step)
    error = error or self._errors.last  # the save thread's exception, logged by orbax
    cause = one_line(error) if error is not None else "it was not committed"
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
    `abstract` is a train state, or with model_only its model half {params, constants}.

    A damaged newest checkpoint is reported in one line and moved aside
    (RunFolder.corrupt_checkpoints) once an older one restored (nothing is deleted); if none
    restores, TrainError refuses to go on.
    """
    steps = sorted(self.manager.all_steps(), reverse=True)
    if step is not None:
      if step not in steps:
        raise TrainError(f"{self.directory}: no checkpoint for step {step} (have {steps})")
      steps = [step]
    failed: list[tuple[int, str]] = []
    for s in steps:
      try:
        with quiet_failed_reads():
          try:
            state = self._restore_step(s, abstract, iterator, model_only)
          except Exception:
            settle_failed_reads()
            raise
      except Exception as e:  # orbax/tensorstore raise many types for damaged files
        if isinstance(e, Stopped) or Stopped.requests:
          raise  # a driver's SIGTERM landed inside the read: a stop, not damage
        if isinstance(e, ValueError) and "tree structures do not match" in str(e):
          # Not damage: this config builds a state of another layout (e.g. another optimizer).
          raise TrainError(f"checkpoint step {s} in {self.directory} holds a state of another "
                           f"structure than this config builds ({one_line(e)}); resume with "
                           "the recorded config.json or use another --workdir") from None
        failed.append((s, one_line(e)))
        print(f"warning: checkpoint step {s} in {self.directory} is unreadable "
              f"({failed[-1][1]})", flush=True)
        continue
      if failed and not self.options.read_only:
        aside = self.set_aside([f for f, _ in failed], run_folder.CORRUPT_CHECKPOINTS)
        print(f"warning: fell back to checkpoint step {s}; moved damaged steps "
              f"{[f for f, _ in failed]} to {aside}", flush=True)
      return state, s
    if failed:
      why = ("nothing to read" if self.options.read_only else
             "refusing to train from scratch over them: move them away or use another --workdir")
      raise TrainError(f"{self.directory}: no readable checkpoint (steps {[f for f, _ in failed]} "
                       f"all failed, newest: {failed[0][1]}); {why}")
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
