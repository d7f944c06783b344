"""Logical axis names used by the model, and the rules that map them onto the (data, fsdp, tensor) mesh.

Model code only names logical axes; the trainer picks the mesh. Parameters carry their names as
`out_sharding` metadata; activations go through `constrain`, a no-op when no mesh is set.
"""
from __future__ import annotations

import jax
from flax.core.spmd import get_logical_axis_rules
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# (logical name, mesh axis or axes). Unlisted names are replicated.
LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("rank", None),
    ("lambda_heads", None),
    ("head_dim", None),
    ("norm", None),
    ("layers", None),
)


def logical_to_spec(names: tuple[str | None, ...], rules=LOGICAL_RULES) -> P:
  table = dict(rules)
  return P(*(table.get(n) if n is not None else None for n in names))


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
  """Sharding constraint by logical names under the current mesh (skipped when none is set)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return x
  spec = logical_to_spec(names, get_logical_axis_rules() or LOGICAL_RULES)
  spec = P(*(s if s is None or _fits(mesh, s) else None for s in spec))
  return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))


def mesh_axes(mesh, name: str) -> str | tuple[str, ...] | None:
  """The mesh axes a logical name maps to under the active rules (those present in `mesh`)."""
  axes = dict(get_logical_axis_rules() or LOGICAL_RULES).get(name)
  if axes is None:
    return None
  kept = tuple(a for a in ((axes,) if isinstance(axes, str) else axes) if a in mesh.axis_names)
  return kept or None


def _fits(mesh, axes) -> bool:
  axes = (axes,) if isinstance(axes, str) else axes
  return all(a in mesh.axis_names for a in axes)
