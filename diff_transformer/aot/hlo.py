"""An optimised HLO module read back: its instructions (shape, opcode, what they call),
computations and stack frames (`file:line` of this repository's code per instruction). The
compiled step's kernel inventory reads it (aot/inventory.py); tools/hlo_kernels.py reads a
profiled step's kernels back to our code with it."""
from __future__ import annotations

import collections
import re

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
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
               "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
ARRAY = re.compile(r"\b(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[0-9,]*)\]")


def arrays(shape: str) -> list[tuple[str, list[int]]]:
  """(dtype, dims) of each array in an HLO shape (a tuple shape gives several)."""
  return [(m["dtype"], [int(d) for d in m["dims"].split(",") if d])
          for m in ARRAY.finditer(shape) if m["dtype"] in DTYPE_BYTES]


def shape_bytes(shape: str) -> int:
  total = 0
  for dtype, dims in arrays(shape):
    n = DTYPE_BYTES[dtype]
    for d in dims:
      n *= d
    total += n
  return total


def operands(rest: str, opcode: str) -> list[str]:
  """The operand names of an instruction (the names inside its opcode's parentheses)."""
  start = rest.find(opcode + "(")
  if start < 0:
    return []
  depth, i = 0, start + len(opcode)
  for j in range(i, len(rest)):
    depth += rest[j] == "("
    depth -= rest[j] == ")"
    if depth == 0:
      return re.findall(r"%([\w.\-]+)", rest[i:j])
  return []


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
            op_name=(o := OP_NAME.search(rest)) and o["op_name"], rest=rest)
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
