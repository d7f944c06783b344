"""What a reader meets in every file of the code and its tests: pyflakes finds nothing (no unused
import or variable, no undefined name, no local that shadows a module before it is assigned), and
no line runs past 100 characters. A line marked `# noqa` is the author's word that a finding is
meant (an import kept for what it registers, or re-exported)."""
from __future__ import annotations

import ast

from pyflakes.checker import Checker

from tests.test_imports import ROOT, SOURCES

FILES = [*SOURCES, *sorted((ROOT / "tests").rglob("*.py"))]


def findings(source: str, name: str) -> list[str]:
  """pyflakes' messages on one file, `name:line:col: message`, except on lines marked noqa."""
  lines = source.splitlines()
  messages = sorted(Checker(ast.parse(source, name), filename=name).messages,
                    key=lambda m: (m.lineno, m.col))
  return [str(m) for m in messages if "# noqa" not in lines[m.lineno - 1]]


def test_pyflakes_finds_nothing():
  found = [m for p in FILES for m in findings(p.read_text(), str(p.relative_to(ROOT)))]
  assert not found, "pyflakes:\n" + "\n".join(found)


def test_pyflakes_names_a_local_that_shadows_a_module():
  """The check can fail: a local assigned after its name's module is used in the same function."""
  source = ("from diff_transformer.evaluation import needle\n\n\ndef f(rows):\n"
            "  acc = needle.evaluate(rows)\n  needle = acc\n  return needle\n")
  [found] = findings(source, "shadow.py")
  assert found.startswith("shadow.py:5:") and "local variable 'needle'" in found
  assert "referenced before assignment" in found
  assert findings(source.replace("  needle = acc\n  return needle\n", "  return acc\n"),
                  "shadow.py") == []


def test_lines_fit_in_100_columns():
  """Read side by side, never scrolled."""
  long = [f"{p.relative_to(ROOT)}:{i}: {len(line)} characters" for p in FILES
          for i, line in enumerate(p.read_text().splitlines(), 1) if len(line) > 100]
  assert not long, "lines over 100 characters:\n" + "\n".join(long)
