"""A train step's time on an NVIDIA H200, estimated from its optimised HLO compiled on a CPU host
(the gpu-aot extra), calibrated on the committed H200 profiles before it predicts anything.

Per kernel of the compiled step (diff_transformer/aot/inventory.py): GEMMs by their FLOPs at a GEMM
rate, cuDNN attention by its FLOPs at an attention rate, every other fusion and copy by the
bytes it reads and writes at a bandwidth. Each rate is fitted, one number per class, on the
profiled cells (benchmarks/results/gpu_check_profile.json and _4096.json: the 830M preset cut to
12 layers, T = 2K and 4K, 16K tokens a step, the four variants, cuDNN in the padded layout that
ran there): the profile's "matmul" class against GEMM FLOPs, "attention" against cuDNN FLOPs,
"other" + "memory" against the other kernels' bytes. Errors are reported per class and per step
on every profiled cell, in sample and leaving the cell out. Then it predicts, labelled as a
prediction: the exact layout's step (cuDNN at the model's own widths, the default where it runs)
for each variant on the 3B rows (full depth, 8K tokens a step, remat full, as the GPU job trains
them) and on the 830M preset at full depth (16K tokens), at 2K and 4K, and each variant's
tokens/s against the Transformer's, beside the DIFF paper's 0.916 (2K) and 0.897 (4K) for 3B.

    python benchmarks/step_estimate.py [--json benchmarks/results/step_estimate.json]
        [--calibration benchmarks/results/step_estimate.json]

The profiles ran the code of their day: after a change to what the step computes, keep their
calibration (`--calibration`, the cells' work as compiled then) and predict with the new code.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from benchmarks.bench_common import paper_config  # noqa: E402
from diff_transformer import aot  # noqa: E402
from diff_transformer.aot import inventory  # noqa: E402
from diff_transformer.aot.hlo import Hlo  # noqa: E402
from diff_transformer.kernels import cudnn  # noqa: E402
from diff_transformer.model.attention import PAPER_VARIANTS  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PROFILES = ("gpu_check_profile.json", "gpu_check_profile_4096.json")
# profile class -> (inventory classes, what is counted)
CLASSES = {"matmul": (("gemm",), "flops"), "attention": (("cudnn", "pallas"), "flops"),
           "other": (("other", "xla_attention", "collective"), "bytes")}
PAPER_RATIO = {2048: 0.916, 4096: 0.897}  # DIFF paper, 3B: DIFF tokens/s / Transformer's
PREDICT = (("3b", 2048, 4, "full"), ("3b", 4096, 2, "full"),
           ("830m", 2048, 8, "none"), ("830m", 4096, 4, "none"))


def work(variant: str, size: str, T: int, batch: int, layers: int, remat: str,
         padded: bool) -> tuple[dict, Hlo]:
  """({profile class: FLOPs or bytes per step}, the HLO) of the step compiled for one H200."""
  c = paper_config(variant, seq_len=T, batch=batch, layers=layers, size=size)
  c.model.remat = remat
  saved = os.environ.get(cudnn.LAYOUT_ENV)
  os.environ[cudnn.LAYOUT_ENV] = "padded" if padded else "exact"
  try:
    compiled, _ = aot.compile_step(c, aot.target("h200:1", 0.9))
  finally:
    if saved is None:
      os.environ.pop(cudnn.LAYOUT_ENV)
    else:
      os.environ[cudnn.LAYOUT_ENV] = saved
  hlo = Hlo(compiled.as_text())
  classes = inventory.inventory(hlo)["classes"]
  out = {name: sum(classes[k][what] for k in kinds) for name, (kinds, what) in CLASSES.items()}
  out["pallas_calls"] = classes["pallas"]["calls"]
  return out, hlo


def fit(cells: list[dict], leave_out: int | None = None) -> dict:
  """Per class the rate (work per ms) with the least squared relative error over the cells."""
  rates = {}
  for name in CLASSES:
    pairs = [(c["work"][name], c["measured_ms"][name]) for i, c in enumerate(cells)
             if i != leave_out and c["work"][name] > 0]
    # minimise sum((w/r - t)^2 / t^2) over 1/r: 1/r = sum(w/t) / sum(w^2/t^2)
    inverse = sum(w / t for w, t in pairs) / sum((w / t) ** 2 for w, t in pairs)
    rates[name] = 1 / inverse
  return rates


def predict_ms(work_: dict, rates: dict) -> dict:
  return {name: work_[name] / rates[name] if work_[name] else 0.0 for name in CLASSES}


def calibrate() -> dict:
  cells = []
  for name in PROFILES:
    record = json.loads((RESULTS / name).read_text())
    T, batch, layers = int(record["T"]), int(record["batch"]), int(record["layers"])
    for cell in record["cells"]:
      ms = cell["ms"]
      w, _ = work(cell["variant"], "830m", T, batch, layers, "none", padded=True)
      cells.append(dict(profile=name, variant=cell["variant"], T=T, batch=batch, layers=layers,
                        work=w, step_ms=float(cell["step_ms"]),
                        measured_ms=dict(matmul=ms["matmul"], attention=ms["attention"],
                                         other=ms["other"] + ms["memory"])))
      print(json.dumps({k: cells[-1][k] for k in ("variant", "T", "work")}), flush=True)
  rates = fit(cells)
  for i, c in enumerate(cells):
    for label, r in (("in_sample", rates), ("left_out", fit(cells, leave_out=i))):
      p = predict_ms(c["work"], r)
      c[f"predicted_ms_{label}"] = p
      c[f"class_error_{label}"] = {k: p[k] / c["measured_ms"][k] - 1 for k in CLASSES}
      c[f"step_error_{label}"] = sum(p.values()) / c["step_ms"] - 1
  worst = {label: dict(
      per_class={k: max(abs(c[f"class_error_{label}"][k]) for c in cells) for k in CLASSES},
      per_step=max(abs(c[f"step_error_{label}"]) for c in cells))
      for label in ("in_sample", "left_out")}
  units = dict(matmul="TFLOP/s", attention="TFLOP/s", other="TB/s")
  return dict(cells=cells, worst_error=worst,
              rates={k: dict(value=round(v * 1e3 / 1e12, 2), unit=units[k])
                     for k, v in rates.items()}, rates_per_ms=rates)


def other_fusions(hlo: Hlo, top: int = 12) -> list[dict]:
  """The step's largest 'other' kernels by bytes a step, with the source line they came from."""
  rows = []
  for name, times, branch in inventory.launches_per_step(hlo):
    k = inventory.kernel(hlo, name)
    if k["cls"] == "other" and not branch:
      inst = hlo.instructions[name]
      body = hlo.computations.get(inst["callee"] or "", [])
      sources = {s for i in body or [name] if (s := hlo.source(hlo.instructions[i]["frame"]))}
      rows.append(dict(hlo_op=name, shape=inst["shape"][:80],
                       mbytes_per_step=times * k["bytes"] / 1e6, sources=sorted(sources)[:4]))
  return sorted(rows, key=lambda r: -r["mbytes_per_step"])[:top]


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", default=str(RESULTS / "step_estimate.json"))
  p.add_argument("--calibration", default="", help=(
      "an earlier step_estimate JSON whose calibration to keep (the profiled cells' work as "
      "compiled then, by the code the profiles ran) instead of compiling those cells again"))
  args = p.parse_args()
  if args.calibration:
    earlier = json.loads(Path(args.calibration).read_text())
    calibration = dict(earlier["calibration"], provenance=earlier.get(
        "calibration_provenance", earlier["provenance"]))
    rates = fit(calibration["cells"])
  else:
    calibration = calibrate()
    rates = calibration.pop("rates_per_ms")
  predictions, fusions = [], {}
  for size, T, batch, remat in PREDICT:
    row: dict[str, Any] = dict(
        size=size, T=T, batch=batch, layers="full depth", remat=remat, layout="exact",
        label="prediction (calibrated on the H200 profiles, not measured)", ms={})
    for variant in PAPER_VARIANTS:
      w, hlo = work(variant, size, T, batch, 0, remat, padded=False)
      if w["pallas_calls"]:  # cuDNN refuses its widths; the Pallas call's FLOPs are not read
        row.setdefault("not_estimated", {})[variant] = (
            "attention through the Pallas kernel (cuDNN refuses its head width); its FLOPs are "
            "not read from the HLO")
        continue
      row["ms"][variant] = predict_ms(w, rates)
      if (size, T) == ("830m", 2048) and variant in ("transformer", "diff"):
        fusions[variant] = other_fusions(hlo)
    step = {v: sum(ms.values()) for v, ms in row["ms"].items()}
    row["step_ms"] = step
    row["tokens_per_s_vs_transformer"] = {v: step["transformer"] / s for v, s in step.items()}
    if size == "3b":
      row["paper_diff_vs_transformer"] = PAPER_RATIO[T]
    predictions.append(row)
    print(json.dumps({k: row[k] for k in ("size", "T", "tokens_per_s_vs_transformer")}), flush=True)
  import jax
  out = dict(provenance=f"compiled for an H200 on a CPU host (jax {jax.__version__}, the gpu-aot "
             "extra); rates fitted on the committed H200 profiles",
             calibration_provenance=calibration.pop("provenance", "compiled with the predictions"),
             classes={
                 k: f"{'+'.join(kinds)} {what}" for k, (kinds, what) in CLASSES.items()},
             calibration=calibration, predictions=predictions,
             largest_other_fusions_830m_2k=fusions,
             worst_left_out_step_error=calibration["worst_error"]["left_out"]["per_step"])
  Path(args.json).write_text(json.dumps(out, indent=1, default=float) + "\n")
  print(f"wrote {args.json}; rates {calibration['rates']}; "
        f"worst errors {calibration['worst_error']}")


if __name__ == "__main__":
  main()
