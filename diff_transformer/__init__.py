"""diff-transformer: differential-attention Transformers in JAX / Flax NNX.

Layout: model/ (decoder, attention variants and their registry, parameter roles, ModelSpec),
kernels/ (reference, xla, pallas, cudnn, and auto's choice), sharding.py, config.py, data/,
training/, runs/ (a saved run: folder, record, lock, checkpoints, restore), evaluation/,
mesh.py and launch.py (the device mesh; the child launcher),
study/ and sweeps/ (the drivers' libraries), interop/ and lm_eval/ (the hf extra); configs/ at
the top level holds the presets, and the programs (train.py, eval.py, ...) sit beside it.
"""
import sys

# flax.nnx asks at import whether it runs inside IPython by importing IPython (0.4 s, in every
# program and child process). When IPython is not loaded yet, the answer is no without importing
# it.
_ipython_absent = "IPython" not in sys.modules
if _ipython_absent:
  sys.modules["IPython"] = None  # type: ignore[assignment]  # import IPython: ImportError
try:
  import flax
  import flax.nnx  # noqa: F401  (the import that asks)
finally:
  if _ipython_absent:
    del sys.modules["IPython"]  # a later `import IPython` works as usual

# Parameters are sharded at creation only where a mesh is set (build_model turns it on then);
# elsewhere (tests, notebooks, single-device analysis) annotated variables stay plain arrays.
flax.config.update("flax_always_shard_variable", False)
