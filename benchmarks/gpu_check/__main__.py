"""The GPU check's driver: `python -m benchmarks.gpu_check --stage NAME --out OUT [--cpu]` runs one
stage of stages.py (tools/gpu_check.sh runs each in its own process under its cap)."""
from __future__ import annotations

import argparse
import importlib
import time
from pathlib import Path

from benchmarks.gpu_check import ROOT
from benchmarks.gpu_check.common import Options, StageRun
from benchmarks.gpu_check.decode import COMMAND_BUFFERS
from benchmarks.gpu_check.stages import BY_NAME, STAGES
from diff_transformer.model.attention import PAPER_VARIANTS

MASKS = ("causal", "document")


def positive_ints(text: str) -> tuple[int, ...]:
  """'2048,4096' -> (2048, 4096); '' -> ()."""
  try:
    values = tuple(int(t) for t in text.split(",") if t)
  except ValueError:
    values = (0,)
  if any(v <= 0 for v in values):
    raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {text!r}")
  return values


DEFAULT = Options()  # the command line's defaults are the options' own


def positive_int(text: str) -> int:
  values = positive_ints(text)
  if len(values) != 1:
    raise argparse.ArgumentTypeError(f"must be one positive integer, got {text!r}")
  return values[0]


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--stage", choices=(*BY_NAME, "all"), default="all",
                 help="; ".join(f"{s.name}: {s.what}" for s in STAGES))
  p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
  p.add_argument("--cpu", action="store_true", help="tiny shapes, Pallas interpreted")
  p.add_argument("--seconds", type=float, default=120.0, help="this stage's time cap")
  p.add_argument("--train_layers", type=int, default=DEFAULT.train_layers,
                 help="layer cut of the preset; 0: its full depth")
  p.add_argument("--size", default=DEFAULT.size, help="the configs/scaling.py preset size the "
                 "kernels, train, profile and decode stages use (e.g. 3b)")
  p.add_argument("--remat", default=DEFAULT.remat, help="train and profile: model.remat")
  p.add_argument("--train_tokens", type=int, default=DEFAULT.train_tokens,
                 help="train: tokens per step")
  p.add_argument("--rounds", type=positive_int, default=DEFAULT.rounds,
                 help="train: timed rounds (GPU)")
  p.add_argument("--states", choices=("auto", "all", "one"), default=DEFAULT.states,
                 help="train: every variant's state on the device through the rounds, or one "
                 "at a time (auto: one where they would fill over half its memory)")
  p.add_argument("--lengths", type=positive_ints, default=(),
                 help="comma-separated T replacing the stage's (GPU)")
  p.add_argument("--labels", default=",".join(DEFAULT.labels),
                 help="train: kernel=auto and/or the other path")
  p.add_argument("--tag", default="", help="suffix of the output file's name")
  p.add_argument("--cases", default="", help="correctness: the groups to run, e.g. "
                 "gqa:256,packed:256,mha:2048,3b:2048:packed (layout or packed, then T)")
  p.add_argument("--dtypes", default=",".join(DEFAULT.dtypes),
                 help="correctness: the dtypes each path runs in on a GPU")
  p.add_argument("--variants", default="", help="correctness, kernels, train: only these "
                 "variants, e.g. diff,transformer (default: all four)")
  p.add_argument("--paths", default="", help="correctness, kernels: only these attention paths, "
                 "e.g. cudnn,cudnn_padded,pallas (default: every path the stage has)")
  p.add_argument("--masks", default="", help="train, kernels: comma-separated among causal "
                 "(rows causal end to end, as the DIFF paper trains) and document (packed "
                 "documents masked from each other, data.document_mask; the kernels get segment "
                 "ids) (default: train causal, kernels document)")
  p.add_argument("--document_variants", default=",".join(DEFAULT.document_variants),
                 help="train: the variants the document mask is timed for")
  p.add_argument("--command_buffers", default=",".join(DEFAULT.command_buffers),
                 help="decode: comma-separated settings of the per-token step's XLA command "
                 "buffers, among "
                 f"{','.join(COMMAND_BUFFERS)} (decode.py says what each is)")
  p.add_argument("--batches", type=positive_ints, default=(),
                 help="decode: comma-separated batch sizes replacing the stage's (GPU)")
  args = p.parse_args()
  command_buffers = tuple(args.command_buffers.split(","))
  unknown = [s for s in command_buffers if s not in COMMAND_BUFFERS]
  if unknown:
    p.error(f"--command_buffers must name settings among {','.join(COMMAND_BUFFERS)}; "
            f"got {args.command_buffers!r}")
  split = lambda text: tuple(t for t in text.split(",") if t)
  for name, values, known in (("--variants", split(args.variants), PAPER_VARIANTS),
                              ("--document_variants", split(args.document_variants),
                               PAPER_VARIANTS),
                              ("--masks", split(args.masks), MASKS),
                              ("--dtypes", split(args.dtypes), ("bfloat16", "float32"))):
    unknown = [v for v in values if v not in known]
    if unknown or (name == "--dtypes" and not values):
      p.error(f"{name} must name values among {','.join(known)}; got {','.join(values)!r}")
  options = Options(
      variants=split(args.variants) or PAPER_VARIANTS, paths=split(args.paths),
      masks=split(args.masks), document_variants=split(args.document_variants),
      dtypes=split(args.dtypes), lengths=tuple(args.lengths), labels=split(args.labels),
      tag=args.tag, cases=split(args.cases), size=args.size, train_layers=args.train_layers,
      remat=args.remat, train_tokens=args.train_tokens, states=args.states, rounds=args.rounds,
      command_buffers=command_buffers, batches=tuple(args.batches))
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  for stage in ([s for s in STAGES if s.in_all] if args.stage == "all" else [BY_NAME[args.stage]]):
    start = time.time()
    print(f"== {stage.name}", flush=True)
    module = importlib.import_module(f"benchmarks.gpu_check.{stage.module}")
    getattr(module, f"stage_{stage.name}")(StageRun(stage.name, out, args.cpu, args.seconds,
                                                    options))
    print(f"== {stage.name} done in {time.time() - start:.1f} s", flush=True)


if __name__ == "__main__":
  main()
