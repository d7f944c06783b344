"""Which lines of our code each profiled kernel runs: the GPU check's profile joined with the
optimised HLO it saved beside it.

    python tools/hlo_kernels.py benchmarks/results/gpu_check_profile_exact.json --variant diff
    python tools/hlo_kernels.py PROFILE.json --variant diff --other --top 30

For each of the step's most expensive kernels (`--other`: XLA's own fusions only, the profile's
"other" class) it prints the milliseconds per step, the HLO instruction the kernel ran
(`hlo_op`), its fusion kind and output shape, the ops inside it, and the source lines of this
repository those ops were traced from (`file:line function`, innermost first). So the small
fusions of a step (the map mix, the per-head norm, the scale) can be read back to the code that
made them, and whether two of them could have been one, offline, after a time-limited GPU job.
The HLO file is the one the profile record names for the variant (`hlo`), in the same folder.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diff_transformer import cli  # noqa: E402
from diff_transformer.aot.hlo import Hlo  # noqa: E402
from diff_transformer.errors import UserError  # noqa: E402
from diff_transformer.files import read_json  # noqa: E402


def read_hlo(path: Path) -> Hlo:
  """A saved HLO (gzipped text), or one line saying why the file is not one."""
  if not path.is_file():
    raise UserError(f"{path}: {'a folder' if path.is_dir() else 'not found'}; give a saved "
                    "HLO file (*.txt.gz)")
  try:
    text = gzip.decompress(path.read_bytes()).decode("utf-8")
  except (OSError, EOFError, zlib.error) as e:
    raise UserError(f"{path}: not a gzip file ({type(e).__name__})") from None
  except UnicodeDecodeError as e:
    raise UserError(f"{path}: not UTF-8 text once unzipped (byte {e.start})") from None
  hlo = Hlo(text)
  if hlo.entry is None or not hlo.instructions:
    raise UserError(f"{path}: holds no HLO module (no ENTRY computation)")
  return hlo


def report(profile_path: Path, variant: str, top: int, other_only: bool) -> list[dict]:
  record = read_json(profile_path, UserError, "GPU check profile")
  cells = {c["variant"]: c for c in record["cells"]}
  if variant not in cells:
    raise UserError(f"--variant: '{variant}' is not in {profile_path.name} "
                    f"(it has {', '.join(cells)})")
  hlo_name = (record.get("hlo") or {}).get(variant)
  if not hlo_name or not (profile_path.parent / hlo_name).exists():
    raise UserError(f"{profile_path.name}: no saved HLO for '{variant}' beside it "
                    f"(the record's hlo field names {hlo_name!r})")
  hlo = read_hlo(profile_path.parent / hlo_name)
  cell = cells[variant]
  kernels = cell["other_kernels"] if other_only else cell["kernels"]
  return [dict(ms=k["ms"], calls=k["calls"], kernel=k["name"],
               **hlo.describe(k["hlo_op"] or k["name"])) for k in kernels[:top]]


def main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("profile", type=Path, nargs="?", help="a gpu_check_profile*.json record")
  p.add_argument("--hlo", type=Path, nargs="+", default=[],
                 help="instead: saved HLO files (e.g. the decode stage's per-token steps); "
                 "prints the kernels each loop body (a scanned layer) and the entry launch")
  p.add_argument("--variant", default="diff")
  p.add_argument("--top", type=int, default=20)
  p.add_argument("--other", action="store_true", help="XLA's own kernels only")
  p.add_argument("--json", action="store_true", help="print the rows as JSON")
  args = p.parse_args(argv)
  if args.hlo:
    hlos = [(path, read_hlo(path)) for path in args.hlo]  # every file checked before printing
    for path, hlo in hlos:
      for r in hlo.launches():
        print(f"{path.name}  {r['where']} ({r['computation']}): {r['kernels']} kernels")
        for source, n in list(r["by_source"].items())[:args.top]:
          print(f"    {n:4d}  {source}")
    return 0
  if args.profile is None:
    p.error("give a profile record, or --hlo files")
  rows = report(args.profile, args.variant, args.top, args.other)
  if args.json:
    print(json.dumps(rows, indent=1))
    return 0
  for r in rows:
    if r.get("missing"):  # e.g. a kernel of another program traced in the same window
      print(f"{r['ms']:8.3f} ms x{r['calls']:g}  {r['hlo_op']}  (not in this HLO)")
      continue
    shape = r.get("shape", "")
    print(f"{r['ms']:8.3f} ms x{r['calls']:g}  {r['hlo_op']}  {r.get('kind') or r.get('opcode')}"
          f"  {shape if len(shape) <= 80 else shape[:77] + '...'}")
    if r.get("ops"):
      print("           ops: " + ", ".join(f"{op} x{n}" for op, n in r["ops"].items()))
    for source in r.get("sources", [])[:6]:
      print(f"           from {source}")
  return 0


if __name__ == "__main__":
  cli.run(main, absl_flags=False)
