"""Logical axis names used by the model, and the rules that map them onto the (data, fsdp,
tensor) mesh.

Model code only names logical axes; the trainer picks the mesh. Parameters carry their names as
`out_sharding` metadata; activations go through `constrain`, a no-op when no mesh is set.
"""
from __future__ import annotations

import jax
from flax.core.spmd import get_logical_axis_rules
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis names: activations (batch rows, sequence, model width, attention heads) and
# parameters (model width, vocabulary, query / kv heads, FFN width, low rank, lambda heads, head
# width, norm gains, the stacked layer axis).
BATCH, LENGTH, ACT_EMBED, ACT_HEADS = "batch", "length", "act_embed", "act_heads"
EMBED, VOCAB, HEADS, KV_HEADS, MLP = "embed", "vocab", "heads", "kv_heads", "mlp"
RANK, LAMBDA_HEADS, HEAD_DIM, NORM, LAYERS = "rank", "lambda_heads", "head_dim", "norm", "layers"

# (logical name, mesh axis or axes or None = replicated); every logical name is listed.
LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    (BATCH, ("data", "fsdp")),
    (LENGTH, None),
    (ACT_EMBED, None),
    (ACT_HEADS, "tensor"),
    (EMBED, "fsdp"),
    (VOCAB, "tensor"),
    (HEADS, "tensor"),
    (KV_HEADS, "tensor"),
    (MLP, "tensor"),
    (RANK, None),
    (LAMBDA_HEADS, None),
    (HEAD_DIM, None),
    (NORM, None),
    (LAYERS, None),
)


def logical_to_spec(names: tuple[str | None, ...], rules=LOGICAL_RULES) -> P:
  """The PartitionSpec of logical `names` (None = replicated); an unknown name is an error, not
  a silent replication."""
  table = dict(rules)
  unknown = [n for n in names if n is not None and n not in table]
  if unknown:
    raise ValueError(f"unknown logical axis name(s) {unknown}; known: {', '.join(table)}")
  return P(*(table[n] if n is not None else None for n in names))


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
  axes = logical_to_spec((name,), get_logical_axis_rules() or LOGICAL_RULES)[0]
  if axes is None:
    return None
  kept = tuple(a for a in ((axes,) if isinstance(axes, str) else axes) if a in mesh.axis_names)
  return kept or None


def _fits(mesh, axes) -> bool:
  axes = (axes,) if isinstance(axes, str) else axes
  return all(a in mesh.axis_names for a in axes)
