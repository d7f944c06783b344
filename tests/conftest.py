import atexit
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from child_env import OPT_LEVEL_FLAG  # noqa: E402  (tests/ is on sys.path under pytest)

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
# Most tests compile tiny programs and run them a few times, so LLVM's optimisation of the CPU
# code is most of their cost: compile it unoptimised (same HLO, same XLA passes; measured 40% less
# CPU time on tests/test_model.py). A test that trains for many steps runs its child process with
# `child_env.optimized_env()` instead. An XLA_FLAGS that already names the level wins.
if OPT_LEVEL_FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {OPT_LEVEL_FLAG}=0".strip()

