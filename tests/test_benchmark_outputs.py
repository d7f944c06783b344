"""Benchmarks write only where they are told: every one that writes results takes an output
option, and a run told to write elsewhere leaves the checkout as it was (no committed figure, no
README block rewritten)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Modules the benchmark programs import (the GPU check, a package, writes under its --out only).
HELPERS = {"bench_common.py"}


def _status() -> str:
  return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                        capture_output=True, text=True, check=True).stdout


def test_every_benchmark_that_writes_takes_an_output_option():
  missing = []
  unchecked = []
  for path in sorted((ROOT / "benchmarks").glob("*.py")):
    text = path.read_text()
    writes = "write_text(" in text or "write_atomic(" in text or 'open(' in text
    if path.name not in HELPERS and writes and not any(
        f'"{flag}"' in text for flag in ("--out", "--json")):
      missing.append(path.name)
    if '"--out", default=' in text:  # a file path: its folder is checked before measuring
      unchecked.append(path.name)
  assert not missing, f"benchmarks writing results without --out: {missing}"
  assert not unchecked, f"benchmarks whose --out is not checked first (cli.out_file): {unchecked}"


def test_an_out_file_is_checked_before_any_work(tmp_path):
  """cli.out_file makes a missing folder, and refuses a folder, a file as folder or an
  unwritable folder (argparse: exit 2 before anything runs)."""
  import argparse
  import pytest
  from diff_transformer.cli import out_file
  assert out_file(str(tmp_path / "new" / "x.json")) == tmp_path / "new" / "x.json"
  assert (tmp_path / "new").is_dir()
  (tmp_path / "file").write_text("")
  for value, words in ((tmp_path, "is a folder"), (tmp_path / "file" / "x.json", "is a file")):
    with pytest.raises(argparse.ArgumentTypeError, match=words):
      out_file(str(value))
  r = subprocess.run([sys.executable, "benchmarks/synthetic_throughput.py",
                      f"--out={tmp_path / 'file' / 'x.json'}"], cwd=ROOT, capture_output=True,
                     text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=120)
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(
      f"{tmp_path / 'file'} is a file, not a folder"), r.stderr


def test_benchmarks_told_to_write_elsewhere_leave_the_checkout_unchanged(tmp_path):
  before = _status()
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  runs = [
      ["benchmarks/throughput.py", "--d_model=32", "--layers=1", "--head_dim=8", "--ffn_dim=64",
       "--vocab=64", "--batch=2", "--seq_lens=32", "--rounds=1", "--steps=1",
       "--peak_tflops=1", "--variants=transformer", f"--out={tmp_path / 'throughput.json'}"],
      ["benchmarks/synthetic_throughput.py", "--rows=4", "--repeats=1",
       f"--out={tmp_path / 'synthetic.json'}"],
  ]
  procs = [subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for args in runs]
  for proc in procs:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-2000:]
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "synthetic.json", "throughput.json", "throughput.png"]
  assert _status() == before


def test_every_benchmark_imports_by_its_package_path():
  """Every benchmark module imports as `benchmarks.<name>`, the one path its helpers are reached
  by (and mypy's); in a child, as some set the platform or XLA's flags when imported."""
  folder = ROOT / "benchmarks"
  names = [f"benchmarks.{p.stem}" for p in sorted(folder.glob("*.py"))]
  names += [f"benchmarks.gpu_check.{p.stem}" for p in sorted((folder / "gpu_check").glob("*.py"))
            if p.stem != "__main__"]
  code = "import importlib, sys\nfor name in sys.argv[1:]:\n  importlib.import_module(name)"
  r = subprocess.run([sys.executable, "-c", code, *names], cwd=ROOT, capture_output=True,
                     text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
