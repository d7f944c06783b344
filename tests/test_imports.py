"""The import graph tells the truth: no cycles among the library's modules, no arrow from the
library up into configs/ or from interop, model and kernels up into training, function-level
imports only with a comment saying what they avoid, no reach into another module's private names,
no reference to files outside the repository, and library rooms of a readable size."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "diff_transformer"
# Code that ships or runs (tests may poke at internals).
SOURCES = sorted([*PACKAGE.rglob("*.py"), *(ROOT / "configs").rglob("*.py"),
                  *(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "tools").rglob("*.py"),
                  *ROOT.glob("*.py")])
OWN = ("diff_transformer", "configs")
# Attribute names that look private but are another library's documented interface.
FOREIGN_INTERFACE = {"_exit",  # os._exit: leave at once, skipping cleanup handlers
                     "_attn_implementation"}  # transformers' attention-backend switch


def module_name(path: Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SOURCES if p.is_relative_to(PACKAGE)}


def imports(path: Path):
  """(imported module, line number, is function-level) for each own-module import in `path`."""
  tree = ast.parse(path.read_text())
  nested = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(f) if n is not f}
  here = module_name(path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative import
        package = here.split(".")[:len(here.split(".")) - node.level + (path.name == "__init__.py")]
        base = ".".join([*package, *([base] if base else [])])
      # `from package import submodule` depends on the submodule itself.
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    else:
      continue
    for target in targets:
      if target.split(".")[0] in OWN:
        yield target, node.lineno, id(node) in nested


def test_no_import_cycle():
  graph = {m: {t for t, _, _ in imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}
  state: dict[str, int] = {}  # 1 = on the current path, 2 = done
  cycles = []

  def visit(m, path):
    state[m] = 1
    for t in sorted(graph[m]):
      if state.get(t) == 1:
        cycles.append(" -> ".join(path[path.index(t):] + [t]))
      elif t not in state:
        visit(t, path + [t])
    state[m] = 2

  for m in sorted(graph):
    if m not in state:
      visit(m, [m])
  assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_library_never_imports_configs():
  for m, p in MODULES.items():
    for target, line, _ in imports(p):
      assert not target.startswith("configs"), f"{p}:{line}: the library imports {target}"


# Layers that only look down: a saved run (runs/), interop (HF maps and export), the model and
# the kernels never reach into training, which writes runs; readers of runs go through runs/.
NEVER_IMPORTS = {"diff_transformer.interop": "diff_transformer.training",
                 "diff_transformer.runs": "diff_transformer.training",
                 "diff_transformer.model": "diff_transformer.training",
                 "diff_transformer.kernels": "diff_transformer.training",
                 "diff_transformer.lm_eval": "diff_transformer.training",
                 "diff_transformer.evaluation": "diff_transformer.training",
                 "diff_transformer.training": "diff_transformer.interop",
                 "diff_transformer.launch": "diff_transformer.training",
                 "diff_transformer.study": "diff_transformer.training",
                 "diff_transformer.sweeps": "diff_transformer.training"}


def test_lower_layers_never_import_training():
  for m, p in MODULES.items():
    for lower, upper in NEVER_IMPORTS.items():
      if m.startswith(lower):
        for target, line, _ in imports(p):
          assert not target.startswith(upper), f"{p}:{line}: {m} imports {target}"


def test_sweeps_and_studies_import_neither_each_other():
  """Both drive children through launch.py; neither reaches into the other."""
  for m, p in MODULES.items():
    for mine, other in (("diff_transformer.sweeps", "diff_transformer.study"),
                        ("diff_transformer.study", "diff_transformer.sweeps")):
      if m.startswith(mine):
        for target, line, _ in imports(p):
          assert not target.startswith(other), f"{p}:{line}: {m} imports {target}"


# A namesake that is not a run's file: a Hugging Face folder's own config.json.
NAMESAKES = {("config.json", "diff_transformer/interop/hf_import.py")}


def test_only_the_run_folder_module_spells_the_run_folder():
  """One module owns the run folder's layout (runs/folder.py, its RUN_FILES); every other file
  asks it."""
  from diff_transformer.runs.folder import RUN_FILES
  owner = PACKAGE / "runs" / "folder.py"
  for p in SOURCES:
    if p != owner:
      text = p.read_text()
      spelled = [n for n in RUN_FILES if re.search(rf"[\"'/]{re.escape(n)}[\"'/]", text)
                 and (n, str(p.relative_to(ROOT))) not in NAMESAKES]
      assert not spelled, f"{p.relative_to(ROOT)} spells {spelled}: use runs.folder"


def test_rooms_stay_small():
  """Library and benchmark files of at most 280 lines and functions of at most 80: each reads in
  one sitting, with room left for the next edit."""
  for p in [*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
    lines = p.read_text().splitlines()
    assert len(lines) <= 280, f"{p.relative_to(ROOT)}: {len(lines)} lines (split it by job)"
    for node in ast.walk(ast.parse("\n".join(lines))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        length = node.end_lineno - node.lineno + 1
        assert length <= 80, f"{p.relative_to(ROOT)}:{node.lineno}: {node.name} has {length} lines"


def test_function_level_imports_say_why():
  unexplained = []
  for p in SOURCES:
    lines = p.read_text().splitlines()
    for target, line, nested in imports(p):
      if nested and not ("#" in lines[line - 1] or lines[line - 2].strip().startswith("#")):
        unexplained.append(f"{p.relative_to(ROOT)}:{line}: {target}")
  assert not unexplained, ("function-level imports without a comment saying what they avoid:\n"
                           + "\n".join(unexplained))


def test_no_private_access_across_modules():
  for p in SOURCES:
    tree = ast.parse(p.read_text())
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
          and not node.attr.startswith("__") and node.attr not in FOREIGN_INTERFACE
          and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
        raise AssertionError(f"{p.relative_to(ROOT)}:{node.lineno}: reaches into .{node.attr}")
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(OWN):
        # A private name (or module) may be shared inside its own package, never beyond it.
        names = [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        names += [node.module] if "._" in node.module else []
        for name in names:
          owner = name.split("._", 1)[0]
          assert module_name(p).startswith(owner + "."), (
              f"{p.relative_to(ROOT)}:{node.lineno}: imports {name} from outside its package")


# Markdown files the programs write into run folders (named in docs, not part of the repository).
WRITTEN_MD = {"report.md", "compare.md"}


def test_references_stay_inside_the_repository():
  """Every path that climbs out (`../`) stays inside the clone, and every markdown document a
  file names is one the repository has (or one the programs write)."""
  for p in [*SOURCES, *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]:
    for i, line in enumerate(p.read_text().splitlines(), 1):
      where = f"{p.relative_to(ROOT)}:{i}"
      for up in re.findall(r"(?:\.\./)+[\w.-]*", line):
        assert (p.parent / up).resolve().is_relative_to(ROOT), f"{where}: {up} leaves the repo"
      for doc in re.findall(r"[\w./-]*\w\.md\b", line):
        known = (Path(doc).name in WRITTEN_MD or (ROOT / doc.lstrip("/")).is_file()
                 or (p.parent / doc).is_file())
        assert known, f"{where}: {doc} is not in the repository"
