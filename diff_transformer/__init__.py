"""diff-transformer: differential-attention Transformers in JAX / Flax NNX.

Layout: model/ (decoder, attention variants), kernels/ (reference, xla, pallas), sharding.py,
data/, training/, evaluation/, config.py; configs/ at the top level holds the presets.
"""
import flax

# Parameters are sharded at creation only where a mesh is set (build_model turns it on then);
# elsewhere (tests, notebooks, single-device analysis) annotated variables stay plain arrays.
flax.config.update("flax_always_shard_variable", False)
