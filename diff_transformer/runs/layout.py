"""A saved run's shapes: the train state's type, the model's graph and abstract variables on a
mesh (what a checkpoint restores into), and the exact-bits fingerprint of a state."""
from __future__ import annotations

import functools
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from diff_transformer.model import split_params
from diff_transformer.model.spec import ModelSpec
from diff_transformer.params import abstract_model
from diff_transformer.sharding import logical_to_spec

State = dict[str, Any]


class ModelLayout:
  """A model's graph and abstract variables on a mesh, without any optimizer: what training
  starts from and what restoring a model for evaluation needs."""

  def __init__(self, spec: ModelSpec, mesh: jax.sharding.Mesh):
    self.graphdef, self.param_variables, constants = split_params(abstract_model(spec))
    # The logical names straight from each variable's metadata (nnx.get_partition_spec would
    # already apply whatever rules context the caller is in).
    logical = nnx.to_pure_dict(jax.tree.map(
        lambda v: tuple(getattr(v, "out_sharding", None) or ()), self.param_variables,
        is_leaf=lambda x: isinstance(x, nnx.Variable)))
    self.param_shardings = jax.tree.map(
        lambda names: NamedSharding(mesh, logical_to_spec(names)), logical,
        is_leaf=lambda x: isinstance(x, tuple))
    replicated = NamedSharding(mesh, P())
    shaped = lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
    # {params, constants}: the model half of a train state, as a checkpoint restores it
    self.abstract = dict(
        params=jax.tree.map(shaped, nnx.to_pure_dict(self.param_variables), self.param_shardings),
        constants=jax.tree.map(lambda x: shaped(x, replicated), nnx.to_pure_dict(constants)))

  def model(self, state: dict) -> nnx.Module:
    """An nnx model viewing a state's (or a restored model half's) parameters."""
    return nnx.merge(self.graphdef, state["params"], state["constants"])


@functools.lru_cache(maxsize=None)
def _fingerprint_fn():
  def leaf_sums(x):
    # Wrapping uint32 sums are associative: the same bits give the same digest on any mesh.
    if x.dtype.itemsize == 4:
      u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    elif x.dtype.itemsize == 2:
      u = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    else:
      u = x.astype(jnp.uint32)
    u = u.reshape(-1)
    return jnp.stack([jnp.sum(u, dtype=jnp.uint32), jnp.sum(u * (u | 1), dtype=jnp.uint32)])

  return jax.jit(lambda tree: jax.tree.map(leaf_sums, tree))


def fingerprint(tree) -> str:
  """A hex digest of the exact bits of every array of `tree`, independent of its sharding."""
  sums = jax.device_get(_fingerprint_fn()(tree))
  h = hashlib.sha256()
  for path, v in jax.tree_util.tree_flatten_with_path(sums)[0]:
    h.update(jax.tree_util.keystr(path).encode())
    h.update(bytes(memoryview(v.astype("<u4"))))
  return h.hexdigest()
