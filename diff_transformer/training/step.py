"""The jitted train and eval steps: pure functions of (state, batch) over nnx.split state.

The train state is a plain pytree (dict) of arrays:
  step       int32 []       optimizer updates applied so far
  params     pure dict      nnx.Param leaves of the model (float32)
  constants  pure dict      the other model variables (per-layer lambda_init), never trained
  opt_state  optax state    AdamW moments sharded like their parameters

Plain jax.jit over split state (not nnx.jit): the model graph is rebuilt by nnx.merge at trace
time only, so dispatch is cheap (nnx.jit re-traverses the graph on every call). Shardings come
from the parameters' logical `out_sharding` names through sharding.LOGICAL_RULES; the state is
created inside jit with those out_shardings, so no parameter is ever materialised whole on one
device.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from diff_transformer import kernels
from diff_transformer.kernels import cudnn
from diff_transformer.data import synthetic
from diff_transformer.mesh import local_rows
from diff_transformer.model import build_model, split_params
from diff_transformer.model.spec import ModelSpec
from diff_transformer.model.attention import kernel_inputs, spec_from_config
from diff_transformer.sharding import BATCH, LENGTH, LOGICAL_RULES, constrain
from diff_transformer.runs.layout import ModelLayout, State
from diff_transformer.training import loss
from diff_transformer.training.optim import decay_mask, learning_rate_schedule, make_optimizer

Batch = dict[str, jax.Array]


def _dict_tail(path) -> tuple[str, ...]:
  """The trailing run of dict keys of a pytree path (a parameter's path inside any wrapper)."""
  tail: list[str] = []
  for k in reversed(path):
    if not isinstance(k, jax.tree_util.DictKey):
      break
    tail.append(str(k.key))
  return tuple(reversed(tail))


class Trainer:
  """Builds the model's state, its shardings and the jitted steps for one config and mesh."""

  def __init__(self, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
               spec: ModelSpec | None = None):
    self.config, self.mesh = config, mesh
    self.spec = spec or spec_from_config(config.model)
    self.lr_schedule = learning_rate_schedule(config.train)
    self.micro_batches = int(config.train.micro_batches)
    self.z_loss = float(config.train.z_loss)
    # Text rows pack documents (segment ids needed); a synthetic task's row is one sequence, so
    # its all-ones segment ids are dropped and no kernel builds or differentiates a mask. With
    # data.document_mask False a text row is one causal sequence too, positions 0..T-1.
    text = config.data.name not in synthetic.TASKS
    self.packed_rows = text and bool(config.data.document_mask)
    self.row_positions = text and not config.data.document_mask
    self.layout = ModelLayout(self.spec, mesh)
    self.tx = make_optimizer(config.train, decay_mask(self.layout.param_variables, config.train))
    self.replicated = NamedSharding(mesh, P())
    self.abstract_state = jax.eval_shape(functools.partial(self.init_fn, 0))
    self.state_shardings = self._shardings(self.abstract_state)
    self.abstract_state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        self.abstract_state, self.state_shardings)
    # The seed is traced (a key argument), so every seed of one model shares one program.
    self._init = jax.jit(self.init_fn, out_shardings=self.state_shardings)
    # The step as traced for rows the driver found within cuDNN's packed cap, or over it
    # (kernels/cudnn.py `decided`), and as traced without that decision (elsewhere).
    self._train_steps = {over: jax.jit(self._deciding(over), donate_argnums=0,
                                       out_shardings=(self.state_shardings, None))
                         for over in (None, False, True)}
    self._cap_here: dict[int, bool] = {}  # row length -> whether the cap applies on this host
    self._grads = jax.jit(self._grads_fn)
    self._eval_step = jax.jit(self._eval_step_fn)
    self._logits = jax.jit(self._logits_fn)

  # ---- state and shardings -------------------------------------------------------------
  def _shardings(self, abstract_state: State) -> State:
    """Parameters by their logical names; optimizer leaves like the parameter they track."""
    flat = {tuple(_dict_tail(p)): s for p, s in
            jax.tree_util.tree_flatten_with_path(self.layout.param_shardings)[0]}
    shapes = {tuple(_dict_tail(p)): s.shape for p, s in
              jax.tree_util.tree_flatten_with_path(abstract_state["params"])[0]}

    def opt_leaf(path, leaf):
      key = _dict_tail(path)
      if key in flat and shapes[key] == leaf.shape:
        return flat[key]
      return self.replicated  # counters and other scalars

    return dict(step=self.replicated, params=self.layout.param_shardings,
                constants=jax.tree.map(lambda _: self.replicated, abstract_state["constants"]),
                opt_state=jax.tree_util.tree_map_with_path(opt_leaf, abstract_state["opt_state"]))

  def init_fn(self, seed) -> State:
    """A fresh state (unjitted, unsharded) from a seed or a jax.random key (a traced one too)."""
    model = build_model(self.spec, nnx.Rngs(seed))
    _, param_variables, constants = split_params(model)
    params = nnx.to_pure_dict(param_variables)
    return dict(step=jnp.zeros((), jnp.int32), params=params,
                constants=nnx.to_pure_dict(constants), opt_state=self.tx.init(params))

  @contextlib.contextmanager
  def context(self):
    """The mesh plus the logical rules: nnx maps parameter names, constrain() activations."""
    with jax.set_mesh(self.mesh), nnx.logical_axis_rules(LOGICAL_RULES):
      yield

  def init(self, seed: int | None = None) -> State:
    """A fresh sharded state; every array is created in place on its devices."""
    seed = int(self.config.train.seed if seed is None else seed)
    with self.context():
      return self._init(jax.random.key(seed))

  def model(self, state: State) -> nnx.Module:
    """An nnx model viewing the state's parameters (for evaluation or analysis)."""
    return self.layout.model(state)

  # ---- loss ------------------------------------------------------------------------------
  def _loss_fn(self, params, constants, batch: Batch, total_weight):
    """(objective, ((nll sum, z sum, correct sum), layer metrics)) of one (micro-)batch; the
    layer metrics (e.g. lambda, [L] each) come from the same forward as the logits."""
    model = nnx.merge(self.layout.graphdef, params, constants)
    segment_ids_BT = batch["segment_ids"] if self.packed_rows else None
    positions_BT = None if self.row_positions else batch["positions"]  # None: 0..T-1
    logits_BTV, layer_metrics = model(batch["inputs"], positions_BT, segment_ids_BT,
                                      metric_weights_BT=batch["weights"])
    sums = loss.token_sums(logits_BTV, batch["targets"], batch["weights"])
    return loss.objective(sums[0], sums[1], self.z_loss, total_weight), (sums, layer_metrics)

  def _grads_fn(self, params, constants, batch: Batch):
    """Gradients over the whole batch, accumulated over micro-batches with lax.scan; layer
    metrics are averaged over micro-batches weighted by their tokens."""
    total_weight = jnp.maximum(jnp.sum(batch["weights"]), 1.0)
    grad_fn = jax.value_and_grad(self._loss_fn, has_aux=True)
    m = self.micro_batches
    if m == 1:
      (_, (sums, layer_metrics)), grads = grad_fn(params, constants, batch, total_weight)
      return grads, sums, layer_metrics, total_weight

    def split(x_BT):
      # Row j*m + i goes to micro-batch i: each device keeps its own rows (no resharding).
      x_JMT = x_BT.reshape(x_BT.shape[0] // m, m, *x_BT.shape[1:])
      return constrain(jnp.swapaxes(x_JMT, 0, 1), (None, BATCH, LENGTH))

    def body(carry, micro):
      g_acc, sums_acc = carry
      (_, (sums, layer_metrics)), g = grad_fn(params, constants, micro, total_weight)
      weighted = jax.tree.map(lambda v: v * jnp.sum(micro["weights"]), layer_metrics)
      return (jax.tree.map(jnp.add, g_acc, g), jax.tree.map(jnp.add, sums_acc, sums)), weighted

    zeros = jax.lax.with_sharding_constraint(jax.tree.map(jnp.zeros_like, params),
                                             self.layout.param_shardings)
    init = (zeros, (jnp.zeros((), jnp.float32),) * 3)
    (grads, sums), weighted_ML = jax.lax.scan(body, init, jax.tree.map(split, batch))
    layer_metrics = jax.tree.map(lambda v: jnp.sum(v, axis=0) / total_weight, weighted_ML)
    return grads, sums, layer_metrics, total_weight

  def train_step_fn(self, state: State, batch: Batch, lr_scale=None) -> tuple[State, dict]:
    """The pure train step (jitted by train_step; vmapped over members by population.py). With
    `lr_scale`, the step of this config at train.lr * lr_scale: AdamW's update is lr_t (m/sqrt(v)
    + wd p), lr_t = lr * shape(t), so scaling the update is that run's step."""
    params = state["params"]
    grads, (nll_sum, z_sum, correct_sum), layer_metrics, total_weight = self._grads_fn(
        params, state["constants"], batch)
    updates, opt_state = self.tx.update(grads, state["opt_state"], params)
    lr = self.lr_schedule(state["step"])
    if lr_scale is not None:
      updates = jax.tree.map(lambda u: u * lr_scale.astype(u.dtype), updates)
      lr = lr * lr_scale
    metrics = dict(loss=nll_sum / total_weight, grad_norm=optax.tree.norm(grads),
                   lr=lr, tokens=total_weight,
                   accuracy=correct_sum / total_weight, layers=layer_metrics)
    if self.z_loss:
      metrics["z_loss"] = z_sum / total_weight
    new_state = dict(step=state["step"] + 1, params=optax.apply_updates(params, updates),
                     constants=state["constants"], opt_state=opt_state)
    return new_state, metrics

  def _deciding(self, over_cap: bool | None):
    """train_step_fn, its packed cuDNN calls traced for rows within the cap (False) or over it
    (True), or (None) left to decide for themselves."""
    if over_cap is None:
      return self.train_step_fn

    def step(state: State, batch: Batch):
      with cudnn.decided(over_cap):
        return self.train_step_fn(state, batch)
    return step

  def rows_over_cap(self, batch: Mapping) -> bool | None:
    """Whether a row of `batch` (host arrays, or arrays it reads back) holds more documents than
    cuDNN's packed layout takes (model.max_segments), where this step's attention meets that cap
    (on a GPU in the exact layout; kernels/cudnn.py); None elsewhere. Every process of a
    multi-process run answers for all (each reads its own rows)."""
    length = batch["segment_ids"].shape[-1] if self.packed_rows else 0
    if length not in self._cap_here:  # traced once per row length, not at every step
      self._cap_here[length] = self._meets_cap(batch)
    if not self._cap_here[length]:
      return None
    over = cudnn.rows_over_cap(local_rows(batch["segment_ids"]), self.spec.max_segments)
    if jax.process_count() > 1:
      over = bool(np.any(multihost_utils.process_allgather(np.asarray(over))))
    return over

  def _eval_step_fn(self, params, constants, batch: Batch):
    _, ((nll_sum, _, correct_sum), _) = self._loss_fn(params, constants, batch, 1.0)
    return nll_sum, jnp.sum(batch["weights"]), correct_sum

  def _logits_fn(self, params, constants, batch: Batch) -> jax.Array:
    model = nnx.merge(self.layout.graphdef, params, constants)
    return model(batch["inputs"], batch.get("positions"), batch.get("segment_ids"))

  # ---- public entry points (run under the mesh so activation constraints apply) -----------
  def train_step(self, state: State, batch: Batch, host_batch: Mapping | None = None
                 ) -> tuple[State, dict]:
    """(new state, metrics): loss, grad_norm, lr, tokens, accuracy, [z_loss], and `layers`,
    the attention's per-layer metrics ({name: [L]}, e.g. lambda; see Attention.metrics).
    `host_batch`: the rows as the host holds them before `batch` reaches the devices (read for
    rows_over_cap; default: `batch`, read back where it is needed)."""
    over_cap = self.rows_over_cap(batch if host_batch is None else host_batch)
    with self.context():
      return self._train_steps[over_cap](state, batch)

  def lower_train_step(self, batch: Mapping[str, jax.Array | jax.ShapeDtypeStruct],
                       platforms: tuple[str, ...] | None = None, decided: bool = True
                       ) -> jax.stages.Lowered:
    """The train step lowered for the abstract state and `batch` (arrays or
    ShapeDtypeStructs): compile() it for AOT memory analysis without running anything.
    `platforms`: lower for these instead of this host's (e.g. ("cuda",) on a CPU host: its text
    only, benchmarks/lower_cudnn.py), with every 'auto' choice made for the first of them.
    `decided=False`: each packed cuDNN call deciding the cap itself (benchmarks/cap_decision.py)."""
    target = platforms and ("gpu" if platforms[0] in ("cuda", "rocm") else platforms[0])
    with self.context(), (kernels.auto.target_platform(target) if target
                          else contextlib.nullcontext()):
      # Rows within the cap where it applies: what every batch but an unusual one runs.
      step = self._train_steps[False if decided and self._meets_cap(batch) else None]
      if platforms is None:
        return step.lower(self.abstract_state, batch)
      return step.trace(self.abstract_state, batch).lower(lowering_platforms=platforms)

  def _meets_cap(self, batch) -> bool:
    """Whether this step's packed rows meet cuDNN's packed cap here (kernels/cudnn.py)."""
    if not self.packed_rows:
      return False
    p = kernel_inputs(self.spec, batch["segment_ids"].shape[-1])
    return cudnn.cap_applies(kernels.resolve(self.spec.kernel, p.q1, p.k1, p.v))

  def grads(self, state: State, batch: Batch):
    """(grads, mean loss) of one step without updating: for the sharding-equality tests."""
    with self.context():
      grads, (nll_sum, _, _), _, total_weight = self._grads(state["params"],
                                                            state["constants"], batch)
      return grads, nll_sum / total_weight

  def eval_step(self, state: State, batch: Batch):
    """(sum of token NLL, number of weighted tokens, number of those predicted exactly by the
    argmax) of one held-out batch."""
    with self.context():
      return self._eval_step(state["params"], state["constants"], batch)

  def logits(self, state: State, batch: Batch) -> jax.Array:
    """float32 logits [B, T, V] of the state's model on batch["inputs"] (positions and
    segment_ids optional): for analysis of a trained state (checkpoint.restore gives one)."""
    with self.context():
      return self._logits(state["params"], state["constants"], batch)
