"""The GPU check's CPU mode: every stage end to end at tiny shapes with Pallas interpreted, so
the entry the GPU machine runs cannot rot between GPU runs. The stages run in one process (the
driver's `--stage all`); tools/gpu_check.sh's own loop (its plan, one process per stage under
its cap, a failed or capped stage failing the command) is checked on its cheapest stage."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from diff_transformer.errors import UserError
from benchmarks.gpu_check.stages import BY_NAME, JOB_SECONDS, JOBS, STAGES, check

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def check_folder(tmp_path_factory) -> Path:
  out = tmp_path_factory.mktemp("gpu_check")
  proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--stage", "all", "--cpu",
                         "--seconds", "240", "--command_buffers=default,loops",
                         "--out", str(out)], cwd=ROOT, capture_output=True,
                        text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return out


@pytest.fixture(scope="module")
def results(check_folder) -> dict:
  return {p.stem.removeprefix("gpu_check_"): json.loads(p.read_text())
          for p in check_folder.glob("gpu_check_*.json")}


def test_every_stage_wrote_its_record(results):
  assert set(results) == {s.name for s in STAGES if s.in_all}
  for stage, record in results.items():
    assert record["stage"] == stage and record["versions"]["jax"], stage
  assert results["env"]["imports"]["modules"] > 50 and not results["env"]["imports"]["failed"]


def test_correctness_covers_every_path_and_variant_and_passes(results):
  cells = results["correctness"]["cells"]
  assert {c["variant"] for c in cells} == {"transformer", "diff", "shared_diff", "diff_v2"}
  assert {c["path"] for c in cells} == {"reference", "xla", "pallas", "cudnn",
                                       "cudnn_exact_layout"}
  assert {(c["layout"], c["packed"]) for c in cells} == {("mha", False), ("gqa", False),
                                                         ("gqa", True)}
  assert all(c["ok"] for c in cells), [c for c in cells if not c["ok"]][:2]
  grads = {name for c in cells if c["variant"] == "diff" for name in c["errors"]}
  assert grads == {"out", "q1", "k1", "v", "q2", "k2", "lam"}  # every input's gradient checked
  worst = results["correctness"]["worst_by_path_and_dtype"]
  assert all(0 < worst[p]["float32"]["worst"] < 1e-4 for p in worst)


def test_kernel_train_and_decode_stages_measure_every_variant(results):
  summary = results["kernels"]["summary"]
  assert {r["variant"] for r in summary} == {"transformer", "diff", "shared_diff", "diff_v2"}
  assert all(r["fastest_ms"] > 0 for r in summary)
  assert {"cudnn", "cudnn_exact_layout"} <= set(summary[0]["ms"])  # both layouts timed
  assert results["env"]["cudnn"]["exact_layout"] == "the backend is cpu, not a CUDA GPU"
  train = [c for c in results["train"]["cells"] if "tokens_per_s" in c]
  assert {(c["variant"], c["kernel"]) for c in train} >= {(v, "auto") for v in
                                                           ("transformer", "diff", "diff_v2")}
  orbax = results["train"]["orbax"]
  assert orbax["losses_after_restore"] == orbax["losses_after_save"], orbax
  decode = results["decode"]["cells"]
  assert {(c["variant"], c["command_buffers"]) for c in decode} == {
      (v, s) for v in ("transformer", "diff", "shared_diff", "diff_v2")
      for s in ("default", "loops")}
  assert all(c["decode_tokens_per_s"] > 0 for c in decode)
  assert all("decode_vs_default" in c for c in decode if c["command_buffers"] == "loops")
  assert all(c["prefill_vs_transformer"]["n"] == 2 for c in decode if c["variant"] != "transformer")


def test_hlo_kernels_reads_each_profiled_kernel_back_to_our_source_lines(check_folder):
  """tools/hlo_kernels.py joins the profile with its saved HLO: a kernel's fusion kind, the ops
  inside it and the lines of this repository they were traced from."""
  sys.path.insert(0, str(ROOT / "tools"))
  import hlo_kernels
  profile = json.loads((check_folder / "gpu_check_profile.json").read_text())
  kernels = next(c["kernels"] for c in profile["cells"] if c["variant"] == "diff")
  rows = hlo_kernels.report(check_folder / "gpu_check_profile.json", "diff", 40, False)
  assert [r["ms"] for r in rows] == [k["ms"] for k in kernels]
  # Which kernels lead a CPU profile varies with the host's load: the HLO is read whole here.
  hlo = hlo_kernels.Hlo(gzip.decompress(
      (check_folder / profile["hlo"]["diff"]).read_bytes()).decode())
  fusions = [hlo.describe(n) for n, i in hlo.instructions.items() if i["opcode"] == "fusion"]
  assert all(f["ops"] for f in fusions)
  assert any(s.startswith("diff_transformer/model/attention/diff_v1.py:")
             for f in fusions for s in f["sources"])
  with pytest.raises(UserError, match="--variant: 'nope' is not in gpu_check_profile.json"):
    hlo_kernels.report(check_folder / "gpu_check_profile.json", "nope", 5, False)
  step = gzip.decompress((check_folder / "gpu_check_decode_hlo_diff_batch4.txt.gz").read_bytes())
  loops = [r for r in hlo_kernels.Hlo(step.decode()).launches() if r["where"] != "entry"]
  assert loops and all(r["kernels"] > 0 for r in loops)  # the scanned layers' body
  assert any(s.startswith("diff_transformer/model/attention/") for r in loops
             for s in r["by_source"])


def test_profile_sums_each_variants_kernels_by_class(results):
  profile = results["profile"]
  assert [c["variant"] for c in profile["cells"]] == ["transformer", "diff", "shared_diff",
                                                      "diff_v2"]
  for c in profile["cells"]:
    assert c["step_ms"] > 0 and c["kernels"] and set(c["ms"]) <= {*profile["classes"]}
    assert c["busy_ms"] == pytest.approx(sum(c["ms"].values()), abs=0.01)
  assert set(profile["extra_ms_vs_transformer"]) == {"diff", "shared_diff", "diff_v2"}
  from benchmarks.gpu_check.profile import KERNEL_CLASSES
  for c in profile["cells"]:  # XLA's own work, each kernel once, summing to the class
    names = [k["name"] for k in c["other_kernels"]]
    assert names and len(set(names)) == len(names)
    assert not any(rx.search(n) for n in names for _, rx in KERNEL_CLASSES)
    assert sum(k["ms"] for k in c["other_kernels"]) <= c["ms"]["other"] + 0.01 * len(names)


@pytest.mark.parametrize("stage,keys", [
    ("profile", {"transformer", "diff", "shared_diff", "diff_v2"}),
    ("decode", {"transformer_batch4", "diff_batch4", "shared_diff_batch4", "diff_v2_batch4"})])
def test_profile_and_decode_save_each_programs_optimised_hlo(results, check_folder, stage, keys):
  import gzip
  hlo = results[stage]["hlo"]
  assert set(hlo) == keys
  for name in hlo.values():
    text = gzip.decompress((check_folder / name).read_bytes()).decode()
    assert text.startswith("HloModule") and "ENTRY" in text


@pytest.mark.parametrize("stages,status,words", [
    ("env", 2, "error: GPU_CHECK_STAGES entry 'env' is not stage:seconds"),
    (" ", 2, "error: GPU_CHECK_STAGES names no stage"),
    ("env:40 bogus:10", 2, "entry 'bogus:10' is not stage:seconds"),
    ("env:1", 1, "error: stages failed or hit their cap: env"),  # env takes seconds: capped
])
def test_a_malformed_stage_is_named_before_any_runs_and_a_failed_stage_fails_the_command(
    tmp_path, stages, status, words):
  proc = subprocess.run(["bash", "tools/gpu_check.sh", "--cpu", str(tmp_path)], cwd=ROOT,
                        capture_output=True, text=True, timeout=120,
                        env={**os.environ, "GPU_CHECK_STAGES": stages})
  assert proc.returncode == status and words in proc.stderr, proc.stdout + proc.stderr
  assert ("== env exit status 124" in proc.stdout) == (status == 1)  # refused: nothing ran


def test_the_shell_plans_every_stage_and_runs_one_in_its_own_process(tmp_path):
  plan = subprocess.run(["python3", "benchmarks/gpu_check/stages.py", "--plan", "--cpu"],
                        cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
  assert plan == [f"{s.name}:{s.cpu_cap}" for s in STAGES if s.in_all]
  proc = subprocess.run(["bash", "tools/gpu_check.sh", "--cpu", str(tmp_path)], cwd=ROOT,
                        capture_output=True, text=True, timeout=120,
                        env={**os.environ, "GPU_CHECK_STAGES": "tests:60"})
  assert proc.returncode == 0 and "== tests exit status 0" in proc.stdout, proc.stdout + proc.stderr
  record = json.loads((tmp_path / "gpu_check_tests.json").read_text())
  assert record["stage"] == "tests" and record["skipped"].startswith("CPU mode")


def test_an_unknown_command_buffer_setting_is_refused_before_any_stage_runs(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--stage", "decode",
                         "--cpu", "--command_buffers=default,lops", "--out", str(tmp_path)],
                        cwd=ROOT, capture_output=True, text=True, timeout=120,
                        env={**os.environ, "PYTHONPATH": str(ROOT)})
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert "--command_buffers must name settings among default,off,loops; got 'default,lops'" in (
      proc.stderr.splitlines()[-1])
  assert "== decode" not in proc.stdout and not list(tmp_path.iterdir())


def test_the_train_stage_can_make_one_state_at_a_time(tmp_path):
  """Where the variants' states do not fit on the device together (the 3B presets), each turn
  makes a fresh state and drops it after; the rounds still interleave the variants."""
  from benchmarks.gpu_check import train
  from benchmarks.gpu_check.common import Options, StageRun
  options = Options(states="one", labels=("auto",), variants=("transformer", "diff"))  # two
  train.stage_train(StageRun("train", tmp_path, cpu=True, seconds=240, options=options))
  record = json.loads((tmp_path / "gpu_check_train.json").read_text())
  assert record["states"] == "one at a time" and record["orbax"].startswith("not run")
  assert {c["variant"] for c in record["cells"] if c["tokens_per_s"] > 0} == {"transformer",
                                                                              "diff"}
  assert [c["tokens_per_s_vs_transformer"]["n"] for c in record["cells"]] == [2, 2]
  assert all(c["step_s"]["n"] == record["rounds"] for c in record["cells"])


def test_each_gpu_job_fits_its_window_and_names_known_stages():
  """A time-limited GPU job: its stages' caps add up to at most 8 minutes (the machine's start
  comes on top), every entry is one the shell accepts."""
  for job, entries in JOBS.items():
    assert sum(cap for _, cap, _ in entries) <= JOB_SECONDS == 480, job
    assert all(name in BY_NAME for name, _, _ in entries)
    assert check([f"{n}:{c}" + (f":{a}" if a else "") for n, c, a in entries]) == ""


@pytest.mark.parametrize("job", sorted(JOBS))
def test_each_gpu_job_rehearses_on_cpu_through_the_shell(tmp_path, job):
  """The job's own entries (filters and all) through tools/gpu_check.sh at tiny shapes: every
  stage exits 0 and no cell is an error; job 1 trains causal and document-masked rows and times
  each kernel unpacked and packed, job 2 the 3B rows' entry."""
  out = tmp_path / "out"
  proc = subprocess.run(["bash", "tools/gpu_check.sh", "--job", str(job), "--cpu", str(out)],
                        cwd=ROOT, capture_output=True, text=True, timeout=400)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert [p.name for p in out.iterdir()] == [f"gpu_check_job{job}.tar.gz"]  # one archive
  with tarfile.open(out / f"gpu_check_job{job}.tar.gz") as archive:
    archive.extractall(tmp_path / "records", filter="data")
  records = {p.stem.removeprefix("gpu_check_"): json.loads(p.read_text())
             for p in (tmp_path / "records").glob("gpu_check_*.json")}
  cells = [c for r in records.values() for c in r.get("cells", [])]
  assert cells and not [c for c in cells if "error" in c or c.get("ok") is False]
  if job == 1:
    assert set(records) == {"env", "correctness", "kernels_exact", "train_830m_full"}
    train = records["train_830m_full"]["cells"]
    assert {(c["variant"], c["mask"]) for c in train} == {
        *((v, "causal") for v in ("transformer", "diff", "shared_diff", "diff_v2")),
        ("diff", "document"), ("transformer", "document")}
    assert all(c["tokens_per_s"] > 0 for c in train)
    assert all(c["compiled_gib"] > 0 and (c["remat"], c["micro_batches"]) == ("none", 1)
               for c in train)  # compiled first
    kernels = records["kernels_exact"]["cells"]
    for mask in ("causal", "document"):  # unpacked calls timed beside the packed ones
      assert {c["variant"] for c in kernels if c["mask"] == mask and "seconds" in c} == {
          "transformer", "diff", "shared_diff", "diff_v2"}
    assert all(c["oracle_s"] >= 0 for c in records["correctness"]["cells"])  # its cost, per group
    assert {(c["layout"], c["packed"]) for c in records["correctness"]["cells"]} == {
        (size, packed) for size in ("830m", "3b") for packed in (False, True)}
  else:
    assert set(records) == {"train_3b_full", "profile_exact", "decode_command_buffers"}


def test_an_unknown_job_is_refused_before_anything_runs(tmp_path):
  proc = subprocess.run(["bash", "tools/gpu_check.sh", "--job", "3", "--cpu", str(tmp_path)],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and "invalid choice" in proc.stderr
  assert not list(tmp_path.iterdir())


def test_a_cell_over_the_memory_takes_micro_batches_then_remat_then_is_refused():
  """The train stage compiles every cell first: one whose peak (plus the margin) is over what jax
  may take is compiled again at the next lighter launch (two micro-batches, then remat 'full'),
  and takes the first that fits; none fits: it is refused, naming its peak and the limit, before
  anything runs. Under the limit a cell is left as it is."""
  from benchmarks.bench_common import small_config, synthetic_batch
  from benchmarks.gpu_check.fit import FIXED_MARGIN_BYTES, fit_to_memory
  from diff_transformer.mesh import global_batch, make_mesh
  from diff_transformer.training.step import Trainer

  config = small_config("diff", seq_len=32, batch=2)
  trainer = Trainer(config, make_mesh(config.mesh))
  data = global_batch(trainer.mesh, synthetic_batch(2, 32, config.model.vocab_size))
  step = trainer.lower_train_step(data).compile()
  roomy = [dict(trainer=trainer, data=data)]
  fit_to_memory(roomy, {0: step}, FIXED_MARGIN_BYTES + 2 ** 30)
  assert (roomy[0]["remat"], roomy[0]["micro_batches"]) == ("none", 1)
  assert roomy[0]["compiled_gib"] > 0 and "fit_tried" not in roomy[0]
  whole_bytes = round(roomy[0]["compiled_gib"] * 2 ** 30)
  just_under = [dict(trainer=trainer, data=data)]
  compiled = {0: step}
  fit_to_memory(just_under, compiled, FIXED_MARGIN_BYTES + whole_bytes - 1)
  assert (just_under[0]["remat"], just_under[0]["micro_batches"]) == ("none", 2)
  assert just_under[0]["trainer"].micro_batches == 2 and compiled[0] is not step
  assert [t["micro_batches"] for t in just_under[0]["fit_tried"]] == [1, 2]
  tight = [dict(trainer=trainer, data=data)]
  compiled = {0: step}
  fit_to_memory(tight, compiled, FIXED_MARGIN_BYTES + 1024)
  assert [(t["remat"], t["micro_batches"]) for t in tight[0]["fit_tried"]] == [
      ("none", 1), ("none", 2), ("full", 1), ("full", 2)]
  assert isinstance(compiled[0], MemoryError)
  assert str(compiled[0]).startswith("refused before running: compiled peak")
  assert "(remat full, 2 micro-batches)" in str(compiled[0])


@pytest.mark.parametrize("args", [["--part", "3"], ["--job", "1", "--cpu", "--part"]])
def test_an_unknown_option_is_named_before_anything_runs(args):
  proc = subprocess.run(["bash", "tools/gpu_check.sh", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and proc.stdout == ""
  assert proc.stderr.strip() == ("error: gpu_check.sh: '--part' is not an option here: give "
                                 "[--fetch-wheels] or [--job 1|2] [--cpu] [OUT folder], in that "
                                 "order")
