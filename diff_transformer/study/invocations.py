"""Where a study's runs came from: each invocation on a root (command, wall time, runs trained)
in <root>/invocations.jsonl, the machine, and what a rebuild from the records keeps of the
study.json it replaces."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from diff_transformer.errors import UserError
from diff_transformer.files import read_json, read_jsonl
from diff_transformer.paths import write_atomic


def provenance(root: Path, command: str, seconds: float, trained: int, rebuild: bool) -> dict:
  """What study.json says about where its runs come from. An invocation that may train appends
  itself to <root>/invocations.jsonl and names this machine; a rebuild from the records
  (--report_only) changes neither: it keeps the command, wall time and machine of the newest
  training invocation (else of the study.json it replaces) and names itself apart, `rebuilt`."""
  if not rebuild:
    calls = record_invocation(root, command, seconds, trained)
    return dict(command=calls[-1]["command"], wall_seconds=calls[-1]["wall_seconds"],
                invocations=calls, machine=this_machine())
  calls = read_invocations(root)
  before = _previous_study(root)
  last = calls[-1] if calls else before  # the newest training invocation, stopped ones too
  return dict(command=last.get("command", "not recorded"),
              wall_seconds=last.get("wall_seconds", 0.0), invocations=calls,
              machine=last.get("machine", before.get("machine", "not recorded")),
              rebuilt=dict(command=command, machine=this_machine(),
                           time=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))


def this_machine() -> str:
  return f"{platform.machine()}, {_cpu_name()}, {_cores()} cores"


def _previous_study(root: Path) -> dict:
  path = root / "study.json"
  try:  # a damaged study.json is rewritten: nothing to carry over from it
    return read_json(path, UserError, "study results")["study"] if path.is_file() else {}
  except UserError:
    return {}


def read_invocations(root: Path) -> list[dict]:
  """The invocations recorded on this root, oldest first (a torn last line is skipped; other
  damage is one line naming the file and the line)."""
  path = root / "invocations.jsonl"
  return read_jsonl(path, UserError, "study invocations") if path.is_file() else []


def record_invocation(root: Path, command: str, seconds: float, trained: int,
                      stopped_by: str = "") -> list[dict]:
  """Adds this invocation to <root>/invocations.jsonl (rewritten whole, atomically) and returns
  them all: a study run in parts (each part stopped by `stopped_by`, SIGTERM) or resumed over
  several invocations reports the time each took."""
  root.mkdir(parents=True, exist_ok=True)
  call = dict(command=command, wall_seconds=round(seconds, 1), trained=trained,
              finished=round(time.time()), machine=this_machine())
  calls = read_invocations(root) + [dict(call, stopped_by=stopped_by) if stopped_by else call]
  write_atomic(root / "invocations.jsonl", "".join(json.dumps(c) + "\n" for c in calls))
  return calls


def _cpu_name() -> str:
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def _cores() -> int:
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
