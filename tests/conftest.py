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


# Modules by their measured cost (CPU seconds in a whole `-n 2` run, most first). pytest.ini turns
# off xdist's own order (modules with more tests first), which left the single-test modules that
# take a minute (the AOT compile, the MQAR run) for last, with the other worker idle; the longest
# first keeps both workers busy to the end. The order changes only the wall time. Modules not
# named keep their file order after these.
LONGEST_FIRST = (
    "test_aot.py", "test_reliability.py", "test_synthetic_learning.py", "test_study.py",
    "test_lm_eval.py", "test_eval_cli.py", "test_hf_export.py", "test_training_sharding.py",
    "test_pallas_model.py", "test_pallas_kernel.py", "test_training_runs.py",
    "test_training_learning.py", "test_sweep_resume.py", "test_model.py", "test_eval_kvcache.py",
)


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept
