"""The kernels a compiled GPU step launches, read from its optimised HLO (aot/hlo.py): per
launched instruction its class (cuDNN attention, our Pallas kernel, GEMMs, XLA attention if any,
collectives, other fusions), the FLOPs it executes and the bytes it moves, counted per step
through loops (a while's known trip count: the scanned layers, the micro-batches)."""
from __future__ import annotations

import collections
import math
import re

from diff_transformer.aot.hlo import NO_KERNEL, Hlo, arrays, operands, shape_bytes

TARGET = re.compile(r'custom_call_target="(?P<target>[^"]+)"')
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(?P<n>\d+)"')
BRANCHES = re.compile(r"branch_computations=\{(?P<names>[^}]*)\}")
TRUE_FALSE = re.compile(r"(?:true|false)_computation=%?(?P<name>[\w.\-]+)")
CONTRACTING = re.compile(r"lhs_contracting_dims=\{(?P<dims>[0-9,]*)\}")
LAYOUTS = re.compile(r"operand_layout_constraints=\{(?P<shapes>.*?)\}, (?:api_version|metadata)")
MASK = re.compile(r'"mask_type": ?"(?P<mask>\w+)"')
MAX_SEG = re.compile(r'"max_seg_per_batch": ?"?(?P<n>\d+)')
CLASSES = ("cudnn", "pallas", "gemm", "xla_attention", "collective", "other")
ATTENTION_CODE = "diff_transformer/kernels/"
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def _callees(hlo: Hlo, name: str) -> list[tuple[str, int]]:
  """(computation, times per execution of `name`) a control instruction runs: a while's body
  (its known trip count), a call's callee, a conditional's branches (each once: the caller
  chooses among them)."""
  inst = hlo.instructions[name]
  rest = inst["rest"]
  if inst["opcode"] == "while":
    trips = TRIP_COUNT.search(rest)
    return [(inst["body"], int(trips["n"]) if trips else 1)]
  if inst["opcode"] == "call" and inst["callee"]:
    return [(inst["callee"], 1)]
  if inst["opcode"] == "conditional":
    found = BRANCHES.search(rest)
    names = ([n.strip().lstrip("%") for n in found["names"].split(",")] if found
             else [m["name"] for m in TRUE_FALSE.finditer(rest)])
    return [(n, 1) for n in names]
  return []


def launches_per_step(hlo: Hlo) -> list[tuple[str, float, tuple]]:
  """(instruction, executions per step, the conditional branches it sits in as
  ((conditional, branch index), ...)) for every instruction that launches a kernel."""
  out: list[tuple[str, float, tuple]] = []

  def walk(computation: str, times: float, branch: tuple) -> None:
    for name in hlo.computations.get(computation, []):
      inst = hlo.instructions[name]
      if inst["opcode"] == "conditional":
        for i, (callee, _) in enumerate(_callees(hlo, name)):
          walk(callee, times, branch + ((name, i),))
      elif inst["opcode"] in ("while", "call"):
        for callee, n in _callees(hlo, name):
          walk(callee, times * n, branch)
      elif inst["opcode"] not in NO_KERNEL and not inst["opcode"].endswith("-done"):
        out.append((name, times, branch))

  if hlo.entry:
    walk(hlo.entry, 1.0, ())
  return out


def _dots(hlo: Hlo, computation: str, seen: frozenset = frozenset()) -> list[str]:
  """The dot instructions of a computation and of the computations it calls."""
  out = []
  for name in hlo.computations.get(computation, []):
    inst = hlo.instructions[name]
    if inst["opcode"] == "dot":
      out.append(name)
    if inst["callee"] and inst["callee"] not in seen:
      out += _dots(hlo, inst["callee"], seen | {computation})
  return out


def dot_flops(hlo: Hlo, name: str) -> tuple[int, list[int], int]:
  """(FLOPs, result dims, contracting size) of one dot: 2 x result elements x contraction."""
  inst = hlo.instructions[name]
  result = arrays(inst["shape"])[0][1]
  inputs = operands(inst["rest"], "dot")
  lhs = arrays(hlo.instructions[inputs[0]]["shape"])[0][1] if inputs else []
  found = CONTRACTING.search(inst["rest"])
  dims = [int(d) for d in found["dims"].split(",") if d] if found else []
  contraction = math.prod(lhs[d] for d in dims if d < len(lhs))
  return 2 * math.prod(result) * contraction, result, contraction


def _operand_bytes(hlo: Hlo, name: str) -> int:
  inst = hlo.instructions[name]
  return sum(shape_bytes(hlo.instructions[o]["shape"])
             for o in operands(inst["rest"], inst["opcode"]) if o in hlo.instructions)


def moved_bytes(hlo: Hlo, name: str) -> int:
  """The bytes a launched instruction reads and writes in device memory. In a fusion, an
  operand read only through (dynamic-)slices counts those slices, a buffer updated in place
  (dynamic-update-slice) counts only its update, as a scanned layer's stacked weights are."""
  inst = hlo.instructions[name]
  body = hlo.computations.get(inst["callee"] or "", [])
  if inst["opcode"] not in ("fusion", "fusion-start") or not body:  # -start: an async fusion
    return shape_bytes(inst["shape"]) + _operand_bytes(hlo, name)
  users: dict[str, list[str]] = collections.defaultdict(list)
  for n in body:
    for o in operands(hlo.instructions[n]["rest"], hlo.instructions[n]["opcode"]):
      users[o].append(n)
  read, in_place = 0, set()
  for n in body:
    if hlo.instructions[n]["opcode"] != "parameter":
      continue
    uses = [hlo.instructions[u] for u in users[n]]
    if uses and all(u["opcode"] in ("dynamic-slice", "slice") for u in uses):
      read += sum(shape_bytes(u["shape"]) for u in uses)
    elif uses and all(u["opcode"] == "dynamic-update-slice"
                      and operands(u["rest"], u["opcode"])[:1] == [n] for u in uses):
      in_place.add(n)
    else:
      read += shape_bytes(hlo.instructions[n]["shape"])
  root = hlo.instructions[body[-1]]
  outputs = (operands(root["rest"], "tuple") if root["opcode"] == "tuple" else [body[-1]])
  written = 0
  for out in outputs:
    made = hlo.instructions.get(out)
    if made is None:
      continue
    ops = operands(made["rest"], made["opcode"])
    if made["opcode"] == "dynamic-update-slice" and len(ops) > 1 and ops[1] in hlo.instructions:
      written += shape_bytes(hlo.instructions[ops[1]]["shape"])
    else:
      written += shape_bytes(made["shape"])
  return read + written


def kernel(hlo: Hlo, name: str) -> dict:
  """One launched instruction: its class (cudnn, pallas, gemm, xla_attention, collective,
  other), the FLOPs it executes (cuDNN and GEMMs), the bytes it reads and writes, and for a cuDNN
  call its kind, q/k/v widths, heads, mask and cuDNN batch."""
  inst = hlo.instructions[name]
  rest, opcode = inst["rest"], inst["opcode"]
  moved = moved_bytes(hlo, name)
  target = (t := TARGET.search(rest)) and t["target"]
  if target and target.startswith("__cudnn$fmha"):
    return dict(cls="cudnn", **_fmha(hlo, rest, target), bytes=moved)
  if target and ("triton" in target or target == "tpu_custom_call"):
    return dict(cls="pallas", flops=0, bytes=moved)  # our fused kernel (its FLOPs not read)
  if opcode.startswith(COLLECTIVES):
    done = _done_shape(hlo, name)
    return dict(cls="collective", op=opcode.removesuffix("-start"), flops=0,
                bytes=shape_bytes(done if done is not None else inst["shape"]))
  dots = _dots(hlo, inst["callee"]) if inst["callee"] else (
      [name] if opcode == "dot" else [])
  if dots or (target or "").startswith("__cublas"):
    flops, attention = 0, False
    for d in dots:
      flops += dot_flops(hlo, d)[0]
      # a GEMM traced from a kernel module is attention computed by XLA (the einsum paths)
      attention |= (hlo.source(hlo.instructions[d]["frame"]) or "").startswith(ATTENTION_CODE)
    return dict(cls="xla_attention" if attention else "gemm", flops=flops, bytes=moved)
  return dict(cls="other", flops=0, bytes=moved)


def _done_shape(hlo: Hlo, name: str) -> str | None:
  """An async collective's result: the shape of the -done that consumes its -start."""
  for inst in hlo.instructions.values():
    if inst["opcode"].endswith("-done") and name in operands(inst["rest"], inst["opcode"]):
      return inst["shape"]
  return None


def _fmha(hlo: Hlo, rest: str, target: str) -> dict:
  kind = target.removeprefix("__cudnn$fmha")
  layouts = LAYOUTS.search(rest)
  shapes = arrays(layouts["shapes"]) if layouts else []
  q, k, v = (dims for _, dims in shapes[:3]) if len(shapes) >= 3 else ([0] * 4,) * 3
  batch, seq, heads, d_qk = q
  d_v, kv_seq = v[3], k[1]
  mask = (m := MASK.search(rest)) and m["mask"] or "NO_MASK"
  segments = int(m["n"]) if (m := MAX_SEG.search(rest)) else 1
  backward = kind.endswith("Backward")
  # QK^T and PV forward; the backward recomputes QK^T and makes dV, dP, dQ, dK
  per_pair = 2 * seq * kv_seq * heads * batch
  flops = per_pair * ((3 * d_qk + 2 * d_v) if backward else (d_qk + d_v))
  if "CAUSAL" in mask:
    flops //= 2
  return dict(kind=kind, backward=backward, bias="Bias" in kind, mask=mask, heads=heads,
              q=d_qk, k=k[3], v=d_v, batch=batch, seq=seq, max_seg_per_batch=segments,
              flops=flops,
              # cudnn-frontend's dQ accumulator: cuDNN's batch (rows x sequences per row)
              # x heads x T x d, float32 (read from its source, not seen on a GPU)
              dq_accumulator_bytes=4 * batch * max(segments, 1) * heads * seq * d_qk)


def inventory(hlo: Hlo) -> dict:
  """What one step launches, per class: calls per step, FLOPs and bytes; the cuDNN calls by
  kind with their widths and mask; collectives by kind with their bytes. A conditional counts
  its cheapest branch (e.g. the exact cuDNN layout, not the padded fallback of rows over the
  cap); the calls of the other branches are listed with taken=False."""
  launches = launches_per_step(hlo)
  info = {name: kernel(hlo, name) for name, _, _ in launches}
  skipped = _untaken_branches(hlo, launches, info)
  classes: dict[str, dict] = {c: dict(calls=0.0, flops=0.0, bytes=0.0) for c in CLASSES}
  collectives: dict[str, dict] = {}
  fmha: dict[str, dict] = {}
  for name, times, branch in launches:
    k = info[name]
    taken = not any(b in skipped for b in branch)
    if k["cls"] == "cudnn":
      key = f"{k['kind']} q{k['q']} k{k['k']} v{k['v']} {k['mask']}" + (
          "" if taken else " (untaken branch)")
      row = fmha.setdefault(key, dict(
          kind=k["kind"], backward=k["backward"], bias=k["bias"], mask=k["mask"],
          heads=k["heads"], q=k["q"], k=k["k"], v=k["v"], batch=k["batch"], seq=k["seq"],
          max_seg_per_batch=k["max_seg_per_batch"], taken=taken, calls=0.0,
          dq_accumulator_bytes=k["dq_accumulator_bytes"]))
      row["calls"] += times
    if not taken:
      continue
    c = classes[k["cls"]]
    c["calls"] += times
    c["flops"] += times * k["flops"]
    c["bytes"] += times * k["bytes"]
    if k["cls"] == "collective":
      row = collectives.setdefault(k["op"], dict(calls=0.0, bytes=0.0))
      row["calls"] += times
      row["bytes"] += times * k["bytes"]
  return dict(classes=classes, collectives=collectives,
              cudnn=dict(calls=list(fmha.values()), largest_dq_accumulator_bytes=max(
                  (r["dq_accumulator_bytes"] for r in fmha.values() if r["backward"]),
                  default=0)))


def _untaken_branches(hlo: Hlo, launches, info) -> set:
  """(conditional, branch) pairs not counted: all but one branch per conditional, the one
  without a dense-bias cuDNN call (the padded fallback of packed rows over the cap), then
  the one of least FLOPs + bytes."""
  cost: dict[str, dict[int, list]] = collections.defaultdict(dict)
  for name, times, branch in launches:
    k = info[name]
    for conditional, index in branch:
      entry = cost[conditional].setdefault(index, [False, 0.0])
      entry[0] |= k["cls"] == "cudnn" and k["bias"]
      entry[1] += times * (k["flops"] + k["bytes"])
  skipped = set()
  for conditional, by_branch in cost.items():
    for i in range(len(_callees(hlo, conditional))):
      by_branch.setdefault(i, [False, 0.0])  # a branch that launches nothing costs nothing
    chosen = min(by_branch, key=lambda i: tuple(by_branch[i]))
    skipped |= {(conditional, i) for i in by_branch if i != chosen}
  return skipped
