import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
# Most tests compile tiny programs and run them a few times, so compiling is most of their cost:
# xla_flags.FAST_COMPILE_FLAGS for the session and every child process. A test that trains for
# many steps runs its child with `xla_flags.optimized_env()` instead. A flag that XLA_FLAGS
# already names wins. (The library's first import: after the JAX_* variables above.)
from diff_transformer.xla_flags import with_fast_compile  # noqa: E402

os.environ["XLA_FLAGS"] = with_fast_compile(os.environ.get("XLA_FLAGS", ""))


def pytest_addoption(parser):
  parser.addoption("--run-long", action="store_true",
                   help="also run the tests marked long (their point is their scale)")


# Modules by their cost in a whole `-n 2` run (seconds, most first; the hf ones where the extra is
# installed). pytest.ini turns off xdist's own order (modules with more tests first), which leaves
# the few-test modules that take half a minute (the study, the sharding child, the eval CLI run;
# the MQAR run with --run-long) for last beside an idle worker. The order changes only the wall
# time; modules not named follow in file order.
LONGEST_FIRST = (
    "test_driver_faults.py", "test_study.py", "test_population_runs.py",
    "test_synthetic_learning.py",
    "test_training_sharding.py", "test_lm_eval.py", "test_packaging.py",
    "test_eval_cli.py", "test_gpu_check.py", "test_gpu_study.py",
    "test_hf_export.py", "test_training_runs.py", "test_training_learning.py",
    "test_pallas_kernel.py", "test_reliability.py", "test_pallas_model.py", "test_sweep_resume.py",
    "test_hf_import.py", "test_eval_kvcache.py", "test_model.py", "test_attention_numerics.py",
)


def pytest_collection_modifyitems(config, items):
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept
  from diff_transformer.model.attention import variant_names  # the library: after the env above
  registered = set(variant_names())
  for item in items:  # `-m variant -k NAME`: everything one variant must pass
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "variant" in params or registered & {v for v in params.values() if isinstance(v, str)}:
      item.add_marker(pytest.mark.variant)
  if config.getoption("--run-long"):
    return
  skip = pytest.mark.skip(reason="marked long: run with --run-long")
  for item in items:
    if item.get_closest_marker("long"):  # the marker itself, not any keyword spelled "long"
      item.add_marker(skip)


# The tiny byte-level corpus and one uninterrupted reference run, built once per session (the
# xdist workers share them through tests/helpers/shared_dirs.py). Imported after the environment
# above is set: these import the library.
from tests.helpers import runs  # noqa: E402
from tests.helpers.shared_dirs import built_once  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
  return built_once(tmp_path_factory, "corpus", runs.prepare_corpus) / "byte"


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
  """An uninterrupted run: the losses every interrupted run must reproduce bit for bit (built
  once per session: several modules start from it)."""
  def build(workdir: Path) -> None:
    proc = runs.run(workdir, runs.tiny_flags(corpus))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [6, 9, 10]
    assert sorted(runs.losses(workdir)) == list(range(1, runs.STEPS + 1))
  return built_once(tmp_path_factory, "reference", build)
