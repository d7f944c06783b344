"""Fused differential flash attention in Pallas (one pass over K/V for both softmax maps).

attention(q1, k1, v, q2, k2, lam, ...) follows the contract in kernels/common.py;
sharded_attention(mesh, batch_axes, head_axes) wraps it in jax.shard_map.
Variants: `tpu.py` + `tpu_backward.py` (Mosaic, K/V loop in the grid, their shared pieces in
`tpu_blocks.py`; the CPU interpret default) and `triton.py`
(GPU, K/V loop inside the kernel); both share the tile math in `_math.py`.
"""
from diff_transformer.kernels.pallas.api import attention, sharded_attention

__all__ = ["attention", "sharded_attention"]
