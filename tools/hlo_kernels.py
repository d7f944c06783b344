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
import collections
import gzip
import json
import re
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diff_transformer import cli  # noqa: E402
from diff_transformer.errors import UserError  # noqa: E402
from diff_transformer.files import read_json  # noqa: E402

INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+) = (?P<rest>.*)$")
CALLS = re.compile(r"calls=%?(?P<callee>[\w.\-]+)")
BODY = re.compile(r"body=%?(?P<body>[\w.\-]+)")
KIND = re.compile(r"kind=(?P<kind>k\w+)")
FRAME = re.compile(r"stack_frame_id=(?P<id>\d+)")
OP_NAME = re.compile(r'op_name="(?P<op_name>[^"]*)"')
TABLE_ROW = re.compile(r"^(?P<id>\d+) (?P<body>.*)$")
FIELD = re.compile(r"(\w+)=(\d+)")
OWN_CODE = ("diff_transformer/", "benchmarks/", "configs/")
# Instructions that launch nothing of their own on a GPU (views, tuples, control).
NO_KERNEL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while",
             "conditional", "call", "after-all", "partition-id", "replica-id"}


def _shape_and_opcode(rest: str) -> tuple[str, str]:
  """The result shape (a tuple shape may nest parentheses) and the opcode after it."""
  depth, i = 0, 0
  while i < len(rest):
    c = rest[i]
    depth += c == "("
    depth -= c == ")"
    if c == " " and depth == 0:
      break
    i += 1
  match = re.match(r"\s*([a-z][\w\-]*)\(", rest[i:])
  return rest[:i], match.group(1) if match else "?"


class Hlo:
  """An optimised HLO module's instructions by name, its computations' instruction lists, and
  its stack-frame tables (to turn an instruction's stack_frame_id into file:line)."""

  def __init__(self, text: str):
    self.instructions: dict[str, dict] = {}
    self.computations: dict[str, list[str]] = collections.defaultdict(list)
    self.entry: str | None = None
    tables: dict[str, dict[int, str]] = collections.defaultdict(dict)
    section, computation = None, None
    for line in text.splitlines():
      if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
        section, computation = line, None
        continue
      if line.endswith("{") and not line.startswith(" "):
        section = None
        computation = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
        if line.startswith("ENTRY"):
          self.entry = computation
        continue
      if section and (row := TABLE_ROW.match(line)):
        tables[section][int(row["id"])] = row["body"]
        continue
      if computation and (m := INSTRUCTION.match(line)):
        rest = m["rest"]
        shape, opcode = _shape_and_opcode(rest)
        self.instructions[m["name"]] = dict(
            shape=shape, opcode=opcode, computation=computation,
            callee=(c := CALLS.search(rest)) and c["callee"],
            body=(b := BODY.search(rest)) and b["body"],
            kind=(k := KIND.search(rest)) and k["kind"],
            frame=(f := FRAME.search(rest)) and int(f["id"]),
            op_name=(o := OP_NAME.search(rest)) and o["op_name"])
        self.computations[computation].append(m["name"])
    self.files = {i: body.strip('"') for i, body in tables["FileNames"].items()}
    self.functions = {i: body.strip('"') for i, body in tables["FunctionNames"].items()}
    self.locations = {i: dict(FIELD.findall(body)) for i, body in tables["FileLocations"].items()}
    self.frames = {i: dict(FIELD.findall(body)) for i, body in tables["StackFrames"].items()}

  def source(self, frame: int | None) -> str | None:
    """The innermost frame of this repository's code on the stack (`path:line function`): the
    parent ids of the table count from 1, 0 being none."""
    seen = set()
    while frame and frame in self.frames and frame not in seen:
      seen.add(frame)
      info = self.frames[frame]
      where = self.locations.get(int(info.get("file_location_id", 0)), {})
      path = self.files.get(int(where.get("file_name_id", 0)), "")
      for root in OWN_CODE:
        if root in path:
          function = self.functions.get(int(where.get("function_name_id", 0)), "?")
          return f"{path[path.index(root):]}:{where.get('line', '?')} {function}"
      frame = int(info.get("parent_frame_id", 0)) - 1
    return None

  def describe(self, name: str) -> dict:
    """An instruction's kind, shape, the op counts of the computation it calls, and the source
    lines its ops came from (most frequent first)."""
    inst = self.instructions.get(name)
    if inst is None:
      return dict(hlo_op=name, missing=True)
    inner = self.computations.get(inst["callee"] or "", [])
    ops = collections.Counter(self.instructions[i]["opcode"] for i in inner
                              if self.instructions[i]["opcode"] not in ("parameter", "constant"))
    sources = collections.Counter(s for i in inner or [name]
                                  if (s := self.source(self.instructions[i]["frame"])))
    return dict(hlo_op=name, opcode=inst["opcode"], kind=inst["kind"], shape=inst["shape"],
                ops=dict(ops.most_common()), sources=[s for s, _ in sources.most_common()],
                op_name=inst["op_name"])


  def launches(self) -> list[dict]:
    """Per loop body (a while's, e.g. the scanned layers: once per layer) and for the entry
    computation: how many instructions launch a kernel, by the source line they came from."""
    out = []
    loops = [(n, i["body"]) for n, i in self.instructions.items() if i["opcode"] == "while"]
    for label, computation in [("entry", self.entry)] + loops:
      names = [n for n in self.computations.get(computation, [])
               if self.instructions[n]["opcode"] not in NO_KERNEL]
      by_source = collections.Counter(self.source(self.instructions[n]["frame"]) or "?"
                                       for n in names)
      out.append(dict(where=label, computation=computation, kernels=len(names),
                      by_source=dict(by_source.most_common())))
    return out


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
