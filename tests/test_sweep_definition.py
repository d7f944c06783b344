import subprocess
import sys

import pytest

from configs.scaling import preset_size
from configs.sweeps import cpu, table10
from diff_transformer.config import ConfigError
from diff_transformer import launch
from diff_transformer.sweeps.definition import Sweep


def test_builtin_sweeps_validate():
  assert len(cpu.SWEEP.validate().points()) == 28
  assert len(table10.SWEEP.validate().points()) == 36
  c = cpu.get_config("shared_diff-m-400")
  assert c.train.steps == 400 and c.model.d_model == 192 and c.model.shared_diff.rank == 16


@pytest.mark.parametrize("sweep,words", [
    (Sweep("bad", sizes={"x": preset_size("9b")}, budgets={"1": 1}), "unknown preset"),
    (Sweep("bad", sizes={"x": preset_size("830m")}, budgets={"0": 0}), "positive number of steps"),
    (Sweep("bad", sizes={"x": preset_size("830m")}, budgets={"1": 1}, variants=("difff",)),
     "unknown variant"),
    (Sweep("bad", sizes={"x": preset_size("830m")}, budgets={"1": 1}, grid=(("y", "1"),)),
     "unknown size"),
])
def test_bad_sweeps_rejected_before_any_run(tmp_path, sweep, words):
  with pytest.raises(ConfigError, match=words):
    launch.run(sweep, "unused.py", str(tmp_path))
  assert not any(tmp_path.iterdir())  # nothing started


def test_cli_bad_sweep_is_one_line(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("from configs.scaling import preset_size\n"
                 "from diff_transformer.sweeps.definition import Sweep\n"
                 "SWEEP = Sweep('bad', sizes={'x': preset_size('830m')}, budgets={'z': 0})\n")
  out = subprocess.run([sys.executable, "sweep.py", f"--sweep={bad}", f"--root={tmp_path}/r"],
                       capture_output=True, text=True)
  assert out.returncode != 0
  assert out.stderr.strip().splitlines()[-1] == ("error: sweep bad: budget 'z' must be a positive "
                                                 "number of steps, got 0")


def test_print_mode_prints_one_command_per_point(tmp_path, capsys):
  status = launch.run(table10.SWEEP, "configs/sweeps/table10.py", str(tmp_path), mode="print",
                      launcher="sbatch --wrap")
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 36 and set(status.values()) == {"printed"}
  assert lines[0].startswith("sbatch --wrap 'python train.py --config=configs/sweeps/table10.py:")
