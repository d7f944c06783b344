"""Population training's step (training/population.py): members stacked in one program equal
their standalone runs, a per-member lr is an input, and a NaN member is held and named while
the others go on."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from diff_transformer.mesh import make_mesh
from diff_transformer.study.overrides import at_lr
from diff_transformer.training.population import Population
from diff_transformer.training.step import Trainer
from tests.helpers.models import sharding_config

STEPS = 3


def _batches(seed: int, config) -> list[dict]:
  """STEPS random batches of the config's shape (a member's own data order)."""
  rng = np.random.default_rng(seed)
  b, t, v = config.train.global_batch_size, config.data.seq_len, config.model.vocab_size
  out = []
  for _ in range(STEPS):
    tokens = rng.integers(0, v, (b, t + 1)).astype(np.int32)
    out.append(dict(inputs=tokens[:, :-1], targets=tokens[:, 1:],
                    weights=np.ones((b, t), np.float32),
                    positions=np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
                    segment_ids=np.ones((b, t), np.int32)))
  return out


def _standalone(config, seed: int, lr_scale: float, batches: list[dict]):
  config = config.copy_and_resolve_references()
  at_lr(config.train, config.train.lr * lr_scale)
  trainer = Trainer(config, make_mesh(config.mesh))
  state, losses = trainer.init(seed), []
  for batch in batches:
    state, metrics = trainer.train_step(state, batch)
    losses.append(float(metrics["loss"]))
  return state, losses


@pytest.mark.parametrize("variant", ["transformer", "diff"])
def test_a_population_equals_its_members_run_alone(variant):
  """Two seeds at two lrs in one program: every member's losses and final parameters are its
  standalone run's, to float32 reduction-order differences."""
  config = sharding_config(variant)
  config.train.warmup_steps = 1  # the lr reaches its peak inside the 3 steps
  seeds, scales = [3, 7], [1.0, 1.5]
  data = [_batches(s, config) for s in seeds]
  population = Population(Trainer(config, make_mesh(config.mesh)), seeds, scales)
  state, losses = population.init(), []
  for step in range(STEPS):
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *[d[step] for d in data])
    state, metrics = population.members_step(state, stacked)
    losses.append(np.asarray(metrics["loss"]))
    assert np.asarray(metrics["finite"]).all()
  for i, (seed, scale) in enumerate(zip(seeds, scales)):
    alone, alone_losses = _standalone(config, seed, scale, data[i])
    np.testing.assert_allclose([l[i] for l in losses], alone_losses, rtol=2e-6)
    member = jax.tree.map(lambda x: np.asarray(x)[i], state["params"])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, np.asarray(b), rtol=1e-5, atol=1e-6),
                 member, alone["params"])
  assert int(np.asarray(state["step"])[0]) == STEPS


def test_a_nan_member_is_held_and_named_and_the_others_go_on():
  config = sharding_config("transformer")
  data = [_batches(s, config) for s in (0, 1)]
  population = Population(Trainer(config, make_mesh(config.mesh)), [0, 1], [1.0, float("nan")])
  state = population.init()
  finite = []
  for step in range(STEPS):
    stacked = jax.tree.map(lambda *xs: np.stack(xs), *[d[step] for d in data])
    state, metrics = population.members_step(state, stacked)
    finite.append(np.asarray(metrics["finite"]).tolist())
  # member 1's first update is NaN (its lr is); from then on its loss is, and it is held
  assert finite == [[True, True], [True, False], [True, False]]
  assert np.asarray(state["step"]).tolist() == [STEPS, 1]
  alone, _ = _standalone(config, 0, 1.0, data[0])
  member = jax.tree.map(lambda x: np.asarray(x)[0], state["params"])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, np.asarray(b), rtol=1e-5, atol=1e-6),
               member, alone["params"])


def test_a_population_needs_one_seed_and_one_lr_per_member():
  config = sharding_config("transformer")
  with pytest.raises(ValueError, match="2 seeds and 1 lr scales"):
    Population(Trainer(config, make_mesh(config.mesh)), [0, 1], [1.0])


def test_a_population_refuses_the_cudnn_kernel_before_anything_runs():
  """jax's cuDNN attention does not batch over members (tests/test_gpu_aot.py compiles a
  population for an H100): model.kernel=cudnn is one line naming the key, before any data or
  state is made; 'auto' takes the Pallas kernel there."""
  from diff_transformer.errors import TrainError
  from diff_transformer.training.population_loop import check_members
  config = sharding_config("diff")
  config.model.kernel = "cudnn"
  with pytest.raises(TrainError, match=r"^model\.kernel: cudnn cannot train a population"):
    check_members([config, config])
  config.model.kernel = "auto"
  assert check_members([config, config]) == [1.0, 1.0]
