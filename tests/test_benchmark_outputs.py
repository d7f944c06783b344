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
  for path in sorted((ROOT / "benchmarks").glob("*.py")):
    text = path.read_text()
    writes = "write_text(" in text or "write_atomic(" in text or 'open(' in text
    if path.name not in HELPERS and writes and not any(
        f'"{flag}"' in text for flag in ("--out", "--json")):
      missing.append(path.name)
  assert not missing, f"benchmarks writing results without --out: {missing}"


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
