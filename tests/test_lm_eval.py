"""The lm-eval adapter, offline: rolling loglikelihood equals the codebase's own loss times its
token count; lm-eval's `hf` model on the exported folder gives the same per-sample
loglikelihoods (<= 1e-4) as the adapter on the run, for transformer and diff."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("lm_eval")

from tests.helpers.child_env import fake_devices_env  # noqa: E402
from tests.helpers import hf_runs  # noqa: E402

os.environ["HF_DATASETS_OFFLINE"] = "1"
ROOT = Path(__file__).resolve().parents[1]
WORDS = "the king sword crown night day love storm sea ship letter ghost castle river".split()
TASKS = ("dt_mc", "dt_roll", "dt_gen")


def _write_tasks(directory: Path) -> Path:
  """Three tiny local tasks (jsonl + YAML): multiple choice, rolling loglikelihood, generation."""
  rng = np.random.default_rng(0)
  sentence = lambda n: " ".join(rng.choice(WORDS, n))
  directory.mkdir()
  mc = [dict(question=f"Q: {sentence(3)}?", choices=[f" {w}" for w in rng.choice(WORDS, 3)],
             label=int(rng.integers(3))) for _ in range(6)]
  docs = [dict(text=sentence(int(n))) for n in (4, 12, 30)]  # 30 words: several 64-byte windows
  gen = [dict(prompt=sentence(3), answer="x") for _ in range(3)]
  common = "dataset_path: json\ntest_split: test\n"
  for name, rows, body in [
      ("dt_mc", mc, "output_type: multiple_choice\ndoc_to_text: \"{{question}}\"\n"
                    "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{label}}\"\n"
                    "metric_list:\n  - metric: acc\n"),
      ("dt_roll", docs, "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\n"
                        "doc_to_target: \"{{text}}\"\nmetric_list:\n  - metric: word_perplexity\n"),
      ("dt_gen", gen, "output_type: generate_until\ndoc_to_text: \"{{prompt}}\"\n"
                      "doc_to_target: \"{{answer}}\"\ngeneration_kwargs:\n  until: [\"e\"]\n"
                      "  max_gen_toks: 12\n  do_sample: false\n"
                      "metric_list:\n  - metric: exact_match\n")]:
    data = directory / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / f"{name}.yaml").write_text(
        f"task: {name}\n{common}dataset_kwargs:\n  data_files:\n    test: {data}\n{body}")
  return directory


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
  return _write_tasks(tmp_path_factory.mktemp("lm_eval") / "tasks")


VARIANTS = ("transformer", "diff")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
  """{variant: (workdir, exported HF folder)} for both variants, built once for the module."""
  from diff_transformer.interop.export import export_run
  out = {}
  for variant in VARIANTS:
    tmp = tmp_path_factory.mktemp(variant)
    workdir = hf_runs.make_run(tmp / "run", hf_runs.run_config(variant))
    export_run(workdir, tmp / "hf")
    out[variant] = (workdir, tmp / "hf")
  return out


@pytest.fixture(params=VARIANTS)
def run_and_export(request, runs):
  return (request.param, *runs[request.param])


def _evaluate(model: str, model_args: str, tasks: Path) -> dict:
  """lm-eval's evaluation in this process, on the local tasks alone (indexing its thousands of
  built-in task files takes seconds) and without its environment report (torch's collect_env
  runs pip, nvcc and lsb_release: seconds more); the long command-line test runs both."""
  import lm_eval
  from lm_eval.tasks import TaskManager
  import diff_transformer.lm_eval.model  # noqa: F401
  manager = TaskManager(include_path=str(tasks), include_defaults=False)
  with mock.patch("lm_eval.evaluator.add_env_info", lambda results: None):
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=list(TASKS),
                                   task_manager=manager, log_samples=True, batch_size=4,
                                   device="cpu")


def _responses(result: dict, task: str) -> list:
  return [s["resps"] for s in sorted(result["samples"][task], key=lambda s: s["doc_id"])]


def test_rolling_loglikelihood_is_the_codebase_loss(run_and_export):
  from lm_eval.api.instance import Instance
  from diff_transformer.evaluation.common import Fns
  from diff_transformer.lm_eval.model import DiffTransformerLM
  _, workdir, _ = run_and_export
  lm = DiffTransformerLM(workdir=str(workdir), batch_size=2)
  text = "the king sword, a letter to the sea"
  got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])[0]
  ids = lm.tok.encode(text)
  nll = Fns(hf_runs.restored(workdir)).nll(np.asarray([[lm.eot_token_id] + ids[:-1]]),
                                           np.asarray([ids]))
  mean_loss, count = float(nll.mean()), nll.size
  assert abs(got - (-mean_loss * count)) <= 1e-4 * count


def test_adapter_matches_lm_eval_hf_on_the_export(run_and_export, tasks):
  variant, workdir, out = run_and_export
  ours = _evaluate("diff_transformer", f"workdir={workdir}", tasks)
  theirs = _evaluate("hf", f"pretrained={out},dtype=float32", tasks)
  worst = 0.0
  for task in ("dt_mc", "dt_roll"):
    a, b = _responses(ours, task), _responses(theirs, task)
    assert len(a) == len(b) > 0
    for ra, rb in zip(a, b):
      for x, y in zip(ra, rb):
        x, y = (x[0], y[0]) if task == "dt_mc" else (x, y)
        x, y = (x[0], y[0]) if isinstance(x, (list, tuple)) else (x, y)
        worst = max(worst, abs(float(x) - float(y)))
  print(f"{variant}: max per-sample loglikelihood diff vs lm-eval hf {worst:.2e}")
  assert worst <= 1e-4
  mc_a = [[tuple(r[0]) for r in rs] for rs in _responses(ours, "dt_mc")]
  mc_b = [[tuple(r[0]) for r in rs] for rs in _responses(theirs, "dt_mc")]
  assert [[g for _, g in rs] for rs in mc_a] == [[bool(g) for _, g in rs] for rs in mc_b]
  assert _responses(ours, "dt_gen") == _responses(theirs, "dt_gen")


def test_command_line_writes_lm_eval_outputs(runs, tmp_path, tasks, monkeypatch):
  """`python -m diff_transformer.lm_eval`'s main, in-process: lm-eval's own command line with
  the model registered and chosen. As in _evaluate, lm-eval indexes the local tasks only (its CLI
  always indexes its 14,000 task files too: seconds, and nothing of ours) and skips torch's
  environment report."""
  from functools import partialmethod
  from lm_eval.tasks import TaskManager
  from diff_transformer.lm_eval.__main__ import main
  monkeypatch.setattr(TaskManager, "__init__",
                      partialmethod(TaskManager.__init__, include_defaults=False))
  workdir, _ = runs["transformer"]  # read only: the outputs go to --output_path
  monkeypatch.setattr(sys, "argv", [
      "diff_transformer.lm_eval", "--model_args", f"workdir={workdir},batch_size=4", "--tasks",
      "dt_mc", "--include_path", str(tasks), "--output_path", str(tmp_path / "out"),
      "--log_samples"])
  with mock.patch("lm_eval.evaluator.add_env_info"):
    main()
  # (a folder that is not a run, refused in one line: tests/test_reliability.py)
  _assert_outputs(tmp_path / "out")


@pytest.mark.long
def test_the_command_as_a_user_runs_it(runs, tmp_path, tasks):
  """The same as a program, every lm-eval task indexed and its environment report written."""
  workdir, _ = runs["transformer"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
             PYTHONPATH=str(ROOT))
  r = subprocess.run([sys.executable, "-m", "diff_transformer.lm_eval", "--model_args",
                      f"workdir={workdir},batch_size=4", "--tasks", "dt_mc", "--include_path",
                      str(tasks), "--output_path", str(tmp_path / "out"), "--log_samples"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  _assert_outputs(tmp_path / "out")


def _assert_outputs(out: Path) -> None:
  written = [p.name for p in out.rglob("*.json*")]
  assert any(n.startswith("results") for n in written), written
  assert any(n.startswith("samples_dt_mc") for n in written), written


def test_scores_on_several_devices_match_one(runs):
  """Restored onto 2 (fake CPU) devices with a batch that does not divide evenly, the adapter
  scores as on one device (both variants in one child)."""
  from lm_eval.api.instance import Instance
  from diff_transformer.lm_eval.model import DiffTransformerLM
  texts = ["the king sword", "a letter to the sea and the storm", "ghost castle river night " * 4]
  workdirs = {variant: str(workdir) for variant, (workdir, _) in runs.items()}
  one = {variant: DiffTransformerLM(workdir=workdir, batch_size=3).loglikelihood_rolling(
      [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)])
      for variant, workdir in workdirs.items()}
  script = (
      "import json, sys\n"
      "from lm_eval.api.instance import Instance\n"
      "from diff_transformer.lm_eval.model import DiffTransformerLM\n"
      "import jax; assert jax.local_device_count() == 2\n"
      f"texts = {texts!r}\n"
      "print(json.dumps({variant: DiffTransformerLM(workdir=workdir, batch_size=3)"
      ".loglikelihood_rolling([Instance('loglikelihood_rolling', {}, (t,), i) "
      f"for i, t in enumerate(texts)], True) for variant, workdir in {workdirs!r}.items()}}))\n")
  env = dict(fake_devices_env(2), JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  two = json.loads(r.stdout.strip().splitlines()[-1])
  assert two.keys() == one.keys()
  for variant in VARIANTS:
    assert np.allclose(one[variant], two[variant], atol=1e-4, rtol=0), variant


def test_generate_until_samples_reproducibly_from_gen_kwargs(run_and_export):
  """Greedy unless gen_kwargs say do_sample (as lm-eval's hf model); sampled text is the same
  for the same seed and changes with it; a nucleus of one id is greedy again."""
  from lm_eval.api.instance import Instance
  from diff_transformer.evaluation.common import EvalError
  from diff_transformer.lm_eval.model import DiffTransformerLM
  _, workdir, _ = run_and_export
  prompts = ["the king", "a letter to the sea", "ghost castle"]

  def gen(lm, **kwargs) -> list[str]:
    args = dict(until=["\n\n"], max_gen_toks=16, **kwargs)
    return lm.generate_until([Instance("generate_until", {}, (p, args), i)
                              for i, p in enumerate(prompts)], True)
  lm = DiffTransformerLM(workdir=str(workdir), batch_size=4, seed=7)
  greedy = gen(lm)
  assert gen(lm, temperature=0.9) == greedy == gen(lm, do_sample=True, temperature=0.0)
  assert gen(lm, do_sample=True, top_p=1e-6) == greedy
  sampled = gen(lm, do_sample=True, temperature=1.0, top_p=0.95)
  assert sampled != greedy
  assert gen(lm, do_sample="true", temperature=1.0, top_p=0.95) == sampled
  other = DiffTransformerLM(workdir=str(workdir), batch_size=4, seed=8)
  assert gen(other, do_sample=True, temperature=1.0, top_p=0.95) != sampled
  with pytest.raises(EvalError, match="generation_kwargs: temperature >= 0"):
    gen(lm, do_sample=True, top_p=0)
