"""The built wheel (not the editable install) carries every package and config, and the programs
run from it: a fresh venv with the wheel, outside the source tree."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("study.py", "sweep.py")


def source_packages() -> set[str]:
  """Every folder of diff_transformer/ and configs/ that holds Python files, as a package path."""
  out = set()
  for top in ("diff_transformer", "configs"):
    for path in (ROOT / top).rglob("*.py"):
      if "__pycache__" not in path.parts:
        out.add(path.parent.relative_to(ROOT).as_posix())
  return out


def test_the_wheel_installs_every_package_and_the_programs_import_from_it(tmp_path):
  # A clean copy: setuptools would reuse a stale build/ of the checkout.
  src = tmp_path / "src"
  skip = shutil.ignore_patterns(".git", "build", ".cache", "*.egg-info", "__pycache__",
                                ".pytest_cache")

  def ignore(folder, names):  # the top-level runs/ output folder, not diff_transformer/runs
    return set(skip(folder, names)) | ({"runs"} if Path(folder) == ROOT else set())
  shutil.copytree(ROOT, src, ignore=ignore)
  build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                          "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                         capture_output=True, text=True, timeout=300)
  assert build.returncode == 0, build.stderr[-2000:]
  wheel = next((tmp_path / "dist").glob("diff_transformer-*.whl"))
  names = set(zipfile.ZipFile(wheel).namelist())
  missing = [p for p in sorted(source_packages()) if f"{p}/__init__.py" not in names]
  assert not missing, ("packages missing from the wheel (no __init__.py or not in setup.py): "
                       f"{missing}")
  # A fresh venv that sees the installed dependencies but gets the project only from the wheel.
  # The dependencies are wherever this interpreter finds them (a user's venv, or the system
  # interpreter): a .pth in the scratch venv adds those site directories after its own, so the
  # wheel installed there is found before any editable install of the checkout.
  env_dir = tmp_path / "venv"
  venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
  python = env_dir / "bin" / "python"
  own_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                             "['purelib'])"], capture_output=True, text=True).stdout.strip()
  ours = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
  (Path(own_site) / "_dependencies.pth").write_text(
      f"import site; list(map(site.addsitedir, {ours!r}))\n")
  pip = subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True, text=True)
  assert pip.returncode == 0, pip.stderr[-2000:]
  install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                            str(wheel)], capture_output=True, text=True, timeout=300)
  assert install.returncode == 0, install.stderr[-2000:]
  work = tmp_path / "elsewhere"
  work.mkdir()
  for program in PROGRAMS:  # the programs, without the source tree beside them
    shutil.copy(ROOT / program, work / program)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  probe = ("import diff_transformer, configs.studies.retrieval, configs.sweeps.cpu; "
           "import diff_transformer.launch, diff_transformer.study.markdown; "
           "print(diff_transformer.__file__)")
  got = subprocess.run([str(python), "-c", probe], cwd=work, capture_output=True, text=True,
                       env=env, timeout=300)
  assert got.returncode == 0, got.stderr[-2000:]
  assert str(env_dir) in got.stdout, got.stdout  # the wheel's copy, not the source tree
  for program in PROGRAMS:
    run = subprocess.run([str(python), program, "--helpshort"], cwd=work, capture_output=True,
                         text=True, env=env, timeout=300)
    # absl's --helpshort exits 1 after listing the program's flags; an import error lists none.
    assert "--root" in run.stdout and "Traceback" not in run.stderr, run.stderr[-2000:]
