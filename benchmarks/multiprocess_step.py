"""Step time of a 2-process CPU training run (jax.distributed over localhost, gloo), from the
tokens/s that train.py logs (compile excluded): what the per-step cross-process stop-signal
gather cost, measured on the tree at --root (this checkout by default, or an older export).

  python benchmarks/multiprocess_step.py [--root DIR] [--steps 150] [--log_every 25]
Prints one JSON line: median and range of the logged step times in ms. About 1 minute.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from diff_transformer.cli import out_file  # noqa: E402
from diff_transformer.data import prepare_files  # noqa: E402
from diff_transformer.runs.folder import RunFolder  # noqa: E402
WORDS = "the king queen sword crown night day love death fool storm sea ship letter".split()


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--root", default=str(ROOT))
  p.add_argument("--steps", type=int, default=150)
  p.add_argument("--log_every", type=int, default=25)
  p.add_argument("--label", default="", help="recorded with the result, e.g. before/after")
  p.add_argument("--out", type=out_file, default="", help="append the JSON line to this file")
  args = p.parse_args()
  tmp = Path(tempfile.mkdtemp(prefix="mp_step_"))
  rng = np.random.default_rng(0)
  (tmp / "text").mkdir()
  for i in range(40):
    (tmp / "text" / f"doc{i:03d}.txt").write_text(" ".join(rng.choice(WORDS, 400)) + "\n")
  prepare_files([tmp / "text"], tmp / "corpus", tokenizer="byte", val_fraction=0.1,
                progress=False)
  flags = {"data.name": "prepared", "data.path": tmp / "corpus", "data.tokenizer": "byte",
           "data.seq_len": 32, "model.max_seq_len": 32, "model.vocab_size": 264,
           "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2, "model.head_dim": 8,
           "model.ffn_dim": 64, "train.global_batch_size": 8, "train.steps": args.steps,
           "train.log_every": args.log_every, "train.eval_every": 10 ** 6,
           "train.checkpoint_every": 10 ** 6, "train.peak_tflops": 1.0, "mesh.data": -1}
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=args.root,
             XLA_FLAGS="--xla_force_host_platform_device_count=1")
  cmd = [sys.executable, str(Path(args.root) / "train.py"), f"--workdir={tmp / 'run'}",
         *[f"--config.{k}={v}" for k, v in flags.items()],
         f"--coordinator_address=localhost:{port}", "--num_processes=2"]
  procs = [subprocess.Popen(cmd + [f"--process_id={i}"], cwd=args.root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  for proc in procs:
    _, err = proc.communicate(timeout=900)
    if proc.returncode:
      sys.exit(err[-3000:])
  rows = RunFolder(tmp / "run").metric_rows()
  tokens = flags["train.global_batch_size"] * flags["data.seq_len"]
  ms = [1e3 * tokens / r["tokens_per_s"] for r in rows
        if r["kind"] == "train" and np.isfinite(r.get("tokens_per_s", np.nan))]
  line = json.dumps(dict(label=args.label, steps=args.steps, log_every=args.log_every,
                         step_ms_median=float(np.median(ms)), step_ms_min=min(ms),
                         step_ms_max=max(ms), windows=len(ms), load_average=os.getloadavg()))
  print(line)
  if args.out:
    with open(args.out, "a") as f:
      f.write(line + "\n")


if __name__ == "__main__":
  main()
