import atexit
import os
import shutil
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu may be installed for AOT compiles
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # parallel test workers share libtpu
# Silent broadcasts (a [B, T, h] lambda against a [h] vector, say) fail instead of passing.
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
# One persistent compilation cache per test session, shared by the xdist workers and every
# train.py / eval.py child process they start (all inherit the environment): the suite compiles
# the same tiny train steps dozens of times, and a cache hit is the same executable.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache_dir = tempfile.mkdtemp(prefix="diff_transformer_tests_jax_cache_")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
  atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
