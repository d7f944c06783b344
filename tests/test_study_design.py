"""A study's evidence rules on hand tables: censored times compared as bounds with a sign test on
the determined pairs, the design check before any run, the lr grid judged by the primary and
bracketed, still_rising by headroom, and a study rebuilt from its run records alone."""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from diff_transformer import cli
from diff_transformer.errors import UserError, message_lines
from diff_transformer.model.attention import nested
from diff_transformer.study import grid as lr_grid
from diff_transformer.study import formatting, markdown, preamble, records, run_metrics, study_json
from diff_transformer.study.formatting import num
from diff_transformer.stats import paired_censored, seeds_needed, smallest_holm_p
from diff_transformer.runs.record import check_setting, setting

ROOT = Path(__file__).resolve().parents[1]
RETRIEVAL = ROOT / "configs/studies/retrieval.py"


def retrieval():
  return cli.load_definition(str(RETRIEVAL), "study", "STUDY")


def test_censored_pairs_are_bounds_with_a_sign_test_on_the_determined_pairs():
  budget = 600.0
  base = {0: (budget, False), 1: (400.0, True), 2: (budget, False), 3: (500.0, True),
          4: (budget, False), 5: (300.0, True)}
  # seed 0: variant 350 while the baseline never got there by 600: earlier, d < 350 - 600.
  # seed 1: both reached: 300 - 400, earlier. seed 2: both censored: undetermined.
  # seed 3: both reached, 550 - 500: later. seed 4: variant 200 vs censored: earlier.
  # seed 5: the variant never reached it by 600, the baseline did at 300: later, d > 300.
  variant = {0: (350.0, True), 1: (300.0, True), 2: (budget, False), 3: (550.0, True),
             4: (200.0, True), 5: (budget, False)}
  got = paired_censored(variant, base)
  assert (got["n"], got["n_determined"], got["earlier"], got["later"]) == (6, 5, 3, 2)
  assert got["p"] == pytest.approx(scipy_stats.binomtest(3, 5, 0.5).pvalue)
  assert got["bound"] == "undetermined" and math.isnan(got["mean_diff"])  # bounds on both sides
  # Only upper bounds (the baseline censored, the variant not): the mean is '<=' its value.
  one_sided = paired_censored({s: variant[s] for s in (0, 1, 4)}, {s: base[s] for s in (0, 1, 4)})
  assert one_sided["bound"] == "<=" and one_sided["earlier"] == 3
  assert one_sided["mean_diff"] == pytest.approx(((350 - 600) + (300 - 400) + (200 - 600)) / 3)
  assert one_sided["p"] == pytest.approx(0.25)  # 3 of 3 earlier: 2 / 2^3
  exact = paired_censored({1: (300.0, True), 3: (550.0, True)},
                          {1: (400.0, True), 3: (500.0, True)})
  assert exact["bound"] is None and exact["mean_diff"] == pytest.approx(-25.0)
  # A censored entry is printed as a bound with n and n_determined, never with a t interval.
  entry = dict(one_sided, family="primary", p_holm=0.5)
  text = formatting.diff(entry)
  assert text.startswith("<= -250") and "determined 3" in text and "[" not in text
  assert "not bounded" in formatting.diff(dict(got, family="primary", p_holm=1.0))


def test_report_compares_a_censored_primary_by_sign_test_and_leaves_others_descriptive():
  study = dataclasses.replace(retrieval(), variants=("transformer", "diff"), seeds=(0, 1, 2))
  runs = []
  for seed, (tb, rb, tv, rv) in enumerate([(600, False, 350, True), (500, True, 300, True),
                                           (600, False, 600, False)]):
    for v, t, r in (("transformer", tb, rb), ("diff", tv, rv)):
      runs.append(dict(variant=v, size="", seed=seed, steps_to_90=float(t), reached_90=r,
                       final_loss=1.0 + seed + (v == "diff"), noise_share=0.1 * seed,
                       accuracy={"keys=4,len=192": 0.5}))
  compared = study_json.compare(study, runs)["diff"]
  primary = compared["steps_to_90"]
  assert primary["family"] == "primary" and primary["censored"] and primary["n_determined"] == 2
  assert primary["p"] == pytest.approx(0.5) and primary["p_holm"] == pytest.approx(0.5)
  assert compared["noise_share"]["family"] == "secondary" and not math.isnan(
      compared["noise_share"]["p_holm"])
  assert compared["final_loss"]["family"] == "descriptive"
  assert math.isnan(compared["final_loss"]["p"])
  assert "p=" not in formatting.diff(compared["final_loss"])


def test_the_design_check_refuses_what_cannot_conclude_and_names_the_seeds_needed():
  assert smallest_holm_p(3, 5) == pytest.approx(3 * 2 / 32) and seeds_needed(3) == 7
  assert seeds_needed(6) == 8  # the retrieval study's two secondaries x 3 variants
  five = retrieval().with_options(seeds="0,1,2,3,4")
  with pytest.raises(UserError) as e:
    five.validate()
  assert len(message_lines(e.value)) == 1
  assert "cannot reach p < 0.05 with 5 seeds" in str(e.value) and "needs 7 seeds" in str(e.value)
  with pytest.raises(UserError, match="41 seeds; at most 40") as e:  # before any run
    retrieval().with_options(seeds=",".join(str(s) for s in range(41))).validate()
  assert len(message_lines(e.value)) == 1
  study = retrieval().validate()
  assert len(study.seeds) >= 8 and all(d["can_resolve"] for d in study.design().values())
  exploratory = retrieval().with_options(seeds="0,1,2,3,4", exploratory=True).validate()
  result = dict(study=dict(exploratory=True, design=exploratory.design(),
                           seeds=list(exploratory.seeds)), lr_grid={})
  first = preamble.limits(result)[0]
  assert first.startswith("**Exploratory**") and "needs 7" in first


def _grid_record(lr: float, seed: int, reached: bool, steps: float, acc: float, budget: int = 100,
                 failed: str = "") -> dict:
  if failed:
    return dict(lr=lr, seed=seed, budget=budget, failed=failed)
  return dict(lr=lr, seed=seed, budget=budget, reached=reached, steps_to_level=steps,
              final_loss=1.0 - acc, val_accuracy=acc)


def test_the_grid_is_judged_by_the_primary_and_grows_until_bracketed():
  study = dataclasses.replace(retrieval(), variants=("transformer", "diff"),
                              lr_grid=(2e-3, 3e-3, 4.5e-3), lr_grid_seeds=(1000, 1001),
                              lr_grid_extend=2)
  # diff improves with every larger lr up to 1.01e-2 and diverges beyond; the transformer never
  # leaves the floor (0.3) at any lr.
  def outcome(cell: str, lr: float, seed: int) -> dict:
    if cell == "transformer":
      return _grid_record(lr, seed, False, 100.0, 0.30)
    if lr > 0.011:
      return _grid_record(lr, seed, False, 100.0, 0.0, failed="diverged")
    return _grid_record(lr, seed, True, 100.0 - 5000 * lr, 0.95)
  asked = []
  def run_points(points: list[str]) -> dict[str, dict]:
    asked.append(points)
    out = {}
    for p in points:
      parsed = study.parse(p)
      out[p] = outcome(parsed.variant, parsed.lr, parsed.seed)
    return out
  got = lr_grid.tune(study, run_points, floor=0.38)
  diff, transformer = got["decisions"]["diff"], got["decisions"]["transformer"]
  # 4.5e-3 is the top: the grid grew to 6.75e-3, then 1.01e-2 (the cap of 2 above), still the top.
  assert sorted(float(x) for x in got["table"]["diff"]) == [2e-3, 3e-3, 4.5e-3, 6.75e-3, 1.01e-2]
  assert diff["chosen"] == pytest.approx(1.01e-2) and not diff["bracketed"]
  assert transformer["untuned"] and not diff["untuned"]
  assert len(asked) == 3
  # With room for one more point above, the diverged 1.52e-2 brackets it from above.
  study = dataclasses.replace(study, lr_grid_extend=3)
  got = lr_grid.tune(study, run_points, floor=0.38)
  assert got["decisions"]["diff"]["bracketed"] and got["chosen"]["diff"] == pytest.approx(1.01e-2)
  # An lr in the middle is bracketed at once; ties go to the smaller lr.
  mid = {2e-3: [_grid_record(2e-3, 0, True, 80.0, 0.95)],
         3e-3: [_grid_record(3e-3, 0, True, 50.0, 0.95)],
         4.5e-3: [_grid_record(4.5e-3, 0, True, 50.0, 0.95)]}
  decided = lr_grid.decide(study, mid, floor=0.38)
  assert decided["chosen"] == 3e-3 and decided["bracketed"] and decided["extend"] is None
  # More runs reaching the level beats fewer steps.
  split = {2e-3: [_grid_record(2e-3, 0, True, 90.0, 0.95),
                  _grid_record(2e-3, 1, True, 95.0, 0.95)],
           3e-3: [_grid_record(3e-3, 0, True, 20.0, 0.95),
                  _grid_record(3e-3, 1, False, 100.0, 0.5)]}
  assert lr_grid.decide(study, split, floor=0.38)["chosen"] == 2e-3


def test_a_loss_grid_is_judged_by_the_whole_split_loss_with_grid_by_primary(tmp_path):
  """grid_by_primary: the grid chooses by the primary (here the opposite of final_loss), and a
  grid record without it (made before) is not reused; a diverged run's record still is."""
  from configs.studies import lm_scale
  from diff_transformer.study import points
  study = lm_scale.STUDY
  assert study.grid_metric == "loss" and dataclasses.replace(
      study, grid_by_primary=False).grid_metric == "final_loss"
  runs = {lr: [dict(lr=lr, seed=s, budget=10, final_loss=2.0 - lr * 100, loss=1.5 + abs(lr - 4e-3),
                    unigram_entropy=3.3) for s in (1000, 1001)] for lr in study.lr_grid}
  assert lr_grid.decide(study, runs, floor=float("nan"))["chosen"] == 4e-3
  old = dataclasses.replace(study, grid_by_primary=False)
  assert lr_grid.decide(old, runs, floor=float("nan"))["chosen"] == 6e-3
  point = "diff-lr0.004-s1000"
  config = study.get_config(point)
  records.write(tmp_path, point, dict(runs[4e-3][0], final_loss=1.7), setting(config), grid=True)
  assert points.GRID.read(old, tmp_path, point, setting(config))["final_loss"] == 1.7
  kept = dict(runs[4e-3][0])
  kept.pop("loss")
  records.write(tmp_path, point, kept, setting(config), grid=True)
  assert points.GRID.read(study, tmp_path, point, setting(config)) is None
  records.write(tmp_path, point, dict(lr=4e-3, seed=1000, failed="diverged"), setting(config),
                grid=True)
  assert points.GRID.read(study, tmp_path, point, setting(config))["failed"] == "diverged"


def test_the_grid_table_shows_the_metric_the_grid_chose_by():
  """With grid_by_primary the table shows each run's whole-split loss (which ranks the lrs here
  the other way from final_loss), so a reader sees why the chosen lr won."""
  cell = lambda final, whole: dict(final_loss=final, loss=whole, val_accuracy=0.5)
  grid = dict(lrs=[2e-3, 4e-3], seeds=[1000], steps=10, metric="loss", floor=float("nan"),
              table={"diff": {"0.002": {"1000": cell(1.70, 1.61)},
                              "0.004": {"1000": cell(1.60, 1.71)}}},
              decisions={"diff": dict(chosen=2e-3, bracketed=True, untuned=False)})
  text = "\n".join(preamble.lr_grid(dict(lr_grid=grid, study=dict(primary="loss"))))
  assert "| diff | 1000 | 1.6100 | 1.7100 | 0.002 |" in text and "whole validation split" in text
  old = dict(grid, metric="final_loss")
  text = "\n".join(preamble.lr_grid(dict(lr_grid=old, study=dict(primary="final_loss"))))
  assert "| diff | 1000 | 1.7000 | 1.6000 |" in text and "training-time eval rows" in text
  assert "train_seconds" not in text  # no run carries its time: no cost line


def test_the_grid_section_states_its_runs_own_training_time():
  timed = lambda loss, seconds: dict(final_loss=loss, loss=loss, val_accuracy=0.5,
                                     train_seconds=seconds)
  grid = dict(lrs=[2e-3, 4e-3], seeds=[1000, 1001], steps=10, metric="loss", floor=float("nan"),
              table={"diff": {"0.002": {"1000": timed(1.6, 300.0), "1001": timed(1.6, 420.0)},
                              "0.004": {"1000": timed(1.7, 600.0), "1001": dict(failed="nan")}}},
              decisions={"diff": dict(chosen=2e-3, bracketed=True, untuned=False)})
  text = "\n".join(preamble.lr_grid(dict(lr_grid=grid, study=dict(primary="loss"))))
  assert "The 3 grid runs' own training time (`train_seconds`): median 7.0 min, summed 0.4 h." \
      in text


def test_still_rising_counts_the_headroom_and_the_level():
  nearly_done = [(800, 0.98), (1000, 0.997)]  # rose 0.017 but had only 0.02 left
  assert not run_metrics.still_rising(nearly_done, ceiling=1.0)
  assert run_metrics.still_rising([(800, 0.60), (1000, 0.70)], ceiling=1.0)
  # 4% of the headroom
  assert not run_metrics.still_rising([(800, 0.50), (1000, 0.52)], ceiling=1.0)
  assert not run_metrics.still_rising([(800, 0.80), (1000, 0.91)], ceiling=1.0, level=0.9)
  assert run_metrics.still_rising([(800, 0.80), (1000, 0.89)], ceiling=1.0, level=0.9)
  assert run_metrics.still_rising([(800, -2.0), (1000, -1.9)])  # a loss still falling: no ceiling


def test_past_early_descent_and_the_loss_at_part_of_the_budget_from_a_curve():
  # Unigram 3.0; the loss falls to 1.0 (a fall of 2.0), 0.08 of it over the last 20% of steps.
  points = [(100, 2.5), (400, 1.5), (800, 1.08), (1000, 1.0)]
  assert run_metrics.tail_fall(points, 3.0) == pytest.approx(0.08 / 2.0)
  assert run_metrics.tail_fall(points, 0.5) is None  # no fall below the unigram baseline
  assert run_metrics.at_share(points, 0.5) == 1.5 and run_metrics.at_share(points, 1.0) == 1.0
  assert run_metrics.at_share(points, 0.05) is None  # nothing evaluated that early


def test_the_smallest_effect_a_design_resolves():
  from diff_transformer.stats import smallest_effect
  # 8 seeds, 3 comparisons: (t_{1 - 0.05/6, 7} + t_{0.8, 7}) / sqrt(8), about 1.42 paired SDs
  want = (scipy_stats.t.ppf(1 - 0.05 / 6, 7) + scipy_stats.t.ppf(0.8, 7)) / 8 ** 0.5
  assert smallest_effect(8, 3) == pytest.approx(want) and 1.3 < want < 1.5
  assert smallest_effect(16, 3) < smallest_effect(8, 3) < smallest_effect(8, 6)
  assert smallest_effect(1, 3) == float("inf")


def _text_run(variant: str, seed: int, loss: float, ar_hit: float) -> dict:
  return dict(variant=variant, size="", seed=seed, params=1000, lr=1e-3, steps=100, budget=100,
              final_loss=loss, val_accuracy=0.5, train_seconds=60.0, code_versions=["v"],
              loss=loss, ar_hit_loss=ar_hit, others_loss=loss + 0.05, ar_hit_fraction=0.1,
              ar_hit_context=4, unigram_entropy=3.0, still_rising=False, tail_fall=0.03,
              ngram_loss=1.5, ngram_ar_hit_loss=0.8, ngram_others_loss=1.6,
              val_loss_at_25pct=loss + 0.4, val_loss_at_50pct=loss + 0.1, val_loss_at_100pct=loss,
              curve=[(1000, loss + 0.4), (2000, loss + 0.1), (4000, loss)])


@pytest.mark.parametrize("copies", [True, False])
def test_a_text_study_report_says_what_it_resolves_and_drops_an_ar_hit_split_without_copying(
    tmp_path, copies):
  from configs.studies import lm
  study = dataclasses.replace(lm.STUDY, seeds=(0, 1, 2), variants=("transformer", "diff"),
                              exploratory=True)
  ar_hit = 0.5 if copies else 0.9  # below or above the n-gram model's 0.8
  runs = [_text_run("transformer", s, 1.60 + 0.01 * s, ar_hit) for s in range(3)]
  runs += [_text_run("diff", s, 1.62 + 0.02 * s, ar_hit) for s in range(3)]
  config = study.get_config(study.points()[0])
  per_step = config.train.global_batch_size * config.data.seq_len
  for r in runs:  # evaluations at steps 20, 40 and 80 of 80: the columns name those steps
    r["curve"] = [(step * per_step, v) for step, (_, v) in zip((20, 40, 80), r["curve"])]
  origin = dict(command="c", wall_seconds=1.0, invocations=[], machine="m")
  result = study_json.build(study, runs, {}, [], origin)
  text = markdown.write(result, tmp_path).read_text()
  sd = float(np.std([0.01 * s + 0.02 for s in range(3)], ddof=1))  # paired differences
  assert "**What this design can resolve**: with 3 seeds and 1 comparison (Holm)" in text
  assert f"{num(sd, 4)}-{num(sd, 4)} nats" in text
  assert "**Out of reach**" in text and "| transformer | compared | 0.030 | 0.030 | 3/3 |" in text
  assert "| variant | at step 20 | at step 40 | at step 80 |" in text
  assert "From step 20 to step 80 the mean gap" in text
  assert ("**Dropped**" in text) != copies
  assert ("Every run's AR-hit loss is below the n-gram model's (6/6)" in text) == copies
  assert (tmp_path / "loss_vs_tokens.png").is_file()
  assert not (tmp_path / "loss_vs_size.png").exists()


def test_a_record_is_reused_only_for_its_setting(tmp_path):
  study = retrieval()
  config = study.resolved_config("diff-s0", 3e-3)
  records.write(tmp_path, "diff-s0", dict(variant="diff", seed=0), setting(config))
  assert records.read(tmp_path, "diff-s0", setting(config))["variant"] == "diff"
  other_lr = study.resolved_config("diff-s0", 4.5e-3)
  assert records.read(tmp_path, "diff-s0", setting(other_lr)) is None
  other = study.with_options(sets=("data.task.num_keys=6",)).resolved_config("diff-s0", 3e-3)
  assert records.read(tmp_path, "diff-s0", setting(other)) is None
  cadence = study.resolved_config("diff-s0", 3e-3)
  cadence.train.log_every = 7  # logging cadence does not change the result
  assert records.read(tmp_path, "diff-s0", setting(cadence)) is not None
  # A workdir trained under another setting is refused in one line naming the keys, or with
  # retrain moved aside (kept) so the point trains anew.
  (tmp_path / "w").mkdir()
  (tmp_path / "w" / "config.json").write_text(config.to_json_best_effort())
  check_setting(tmp_path / "w", "diff-s0", setting(config))
  with pytest.raises(UserError) as e:
    check_setting(tmp_path / "w", "diff-s0", setting(other))
  assert len(message_lines(e.value)) == 1 and "data.task.num_keys 4 -> 6" in str(e.value)
  assert "--retrain_changed" in str(e.value)
  check_setting(tmp_path / "w", "diff-s0", setting(other), retrain=True)
  aside = list(tmp_path.glob("w.setting-*"))
  assert not (tmp_path / "w").exists() and len(aside) == 1
  assert (aside[0] / "config.json").read_text() == config.to_json_best_effort()
  # A new record for the point keeps the other setting's record aside too.
  records.write(tmp_path, "diff-s0", dict(variant="diff", seed=0), setting(other))
  assert records.read(tmp_path, "diff-s0", setting(other)) is not None
  assert len(list((tmp_path / "records").glob("diff-s0.json.replaced-*"))) == 1


MACHINE_PATH = re.compile(r"(/root/|/home/|/work/|/tmp/|/Users/|[A-Z]:\\\\)")


def test_committed_results_name_no_machine_paths():
  found = []
  for path in [*(ROOT / "docs/results").rglob("*"), *(ROOT / "benchmarks/results").rglob("*")]:
    if path.suffix in (".json", ".jsonl", ".md") and MACHINE_PATH.search(path.read_text()):
      found.append(str(path.relative_to(ROOT)))
  assert not found, found


def assert_unbracketed_choices_flagged(data: dict, text: str) -> None:
  """Every lr choice of a committed study that is not bracketed is named on its report's flag
  line ('Grid not finished' while its grid is)."""
  for cell, decision in data["lr_grid"]["decisions"].items():
    if not decision["bracketed"]:
      flag = "**Not bracketed**" if decision.get("complete", True) else "**Grid not finished**"
      assert cell in next(l for l in text.splitlines() if l.startswith(flag)), (cell, flag)


def test_the_committed_retrieval_study_is_a_design_that_can_conclude():
  """docs/results/study_retrieval/: >= 8 seeds, not exploratory, an lr per variant that is
  bracketed or reported as not bracketed (or its grid as unfinished), n_determined for the
  censored primary, and the records it was built from."""
  folder = ROOT / "docs/results/study_retrieval"
  data = json.loads((folder / "study.json").read_text())
  text = (folder / "report.md").read_text()
  assert len(data["study"]["seeds"]) >= 8 and not data["study"]["exploratory"]
  assert data["study"]["design"]["primary"]["can_resolve"]
  assert_unbracketed_choices_flagged(data, text)
  for variant, table in data["paired"].items():
    assert table["steps_to_90"]["n_determined"] <= table["steps_to_90"]["n"], variant
  recorded = {p.stem for p in (folder / "records").glob("*.json")}
  assert {r["point"] for r in data["runs"]} <= recorded


def test_the_committed_lm_study_is_past_early_descent_and_can_conclude():
  """docs/results/study_lm/: a design of >= 8 seeds that can conclude, every variant run on every
  seed; every recorded run (the lr-grid runs are the pilot) past early descent (under 5% of its
  fall in its last 20%); an lr per variant bracketed or reported as not (or its grid as
  unfinished); the pilot behind the dropped AR-hit secondary committed with it."""
  from configs.studies import lm
  assert len(lm.STUDY.seeds) >= 8 and lm.STUDY.validate().design()["primary"]["can_resolve"]
  folder = ROOT / "docs/results/study_lm"
  data = json.loads((folder / "study.json").read_text())
  text = (folder / "report.md").read_text()
  assert data["study"]["seeds"] == list(lm.STUDY.seeds) and not data["study"]["exploratory"]
  records = {p: json.loads(p.read_text()) for p in (folder / "records").rglob("*.json")}
  assert len(records) >= 6 and all(r["tail_fall"] < 0.05 for r in records.values())
  compared = {(r["variant"], r["seed"]): r for p, r in records.items()
              if p.parent == folder / "records"}  # records/lr_grid/ holds the grid's
  assert not data["missing"] and set(compared) == {
      (v, s) for v in data["study"]["variants"] for s in lm.STUDY.seeds}
  assert all(math.isfinite(r["loss"]) for r in compared.values())
  assert_unbracketed_choices_flagged(data, text)
  pilot = [json.loads(p.read_text()) for p in (folder / "pilot").glob("*.loss.json")]
  assert pilot and lm.STUDY.secondary == ()
  assert all(r["ar_hit_context"] == 4 and r["ar_hit"]["loss"] > r["ar_hit"]["ngram_loss"]
             for r in pilot)  # no sign of copying in context: the Table 6 analog is dropped


def test_the_committed_children_benchmark_backs_the_default_jobs():
  """benchmarks/results/study_children.json: runs per hour with one child on every core and with
  two single-threaded children, on 2 cores, the same results either way; study.py's --jobs
  default is the faster of the two."""
  bench = json.loads((ROOT / "benchmarks/results/study_children.json").read_text())
  assert "2 cores" in bench["machine"] and bench["identical_final_losses"]
  rates = {int(k): sorted(v) for k, v in bench["runs_per_hour"].items()}
  assert set(rates) == {1, 2} and all(len(v) >= 1 and min(v) > 0 for v in rates.values())
  faster = max(rates, key=lambda jobs: rates[jobs][len(rates[jobs]) // 2])  # by the median
  default = re.search(r'DEFINE_integer\("jobs", (\d+),', (ROOT / "study.py").read_text())
  assert default and int(default.group(1)) == faster


def test_a_run_records_its_code_and_a_study_over_two_versions_says_so(tmp_path, monkeypatch):
  from diff_transformer import provenance
  from diff_transformer.runs import record as run_record
  now = provenance.code_version()
  assert set(provenance.LIBRARIES) == set(now["libraries"]) and now["libraries"]["jax"]
  if (ROOT / ".git").exists():  # a checkout (a wheel records no commit)
    assert re.fullmatch(r"[0-9a-f]{40}", now["commit"]) and isinstance(now["dirty"], bool)
  assert run_record.record_code_version(tmp_path, 0) is None  # a new run: nothing replaced
  assert run_record.record_code_version(tmp_path, 50) is None  # same code: no new entry
  other = dict(now, commit="0" * 40, dirty=False)
  monkeypatch.setattr(provenance, "code_version", lambda: other)
  assert run_record.record_code_version(tmp_path, 80) == dict(step=0, **now)  # the replaced one
  versions = run_record.read_code_versions(tmp_path)
  assert [v["step"] for v in versions] == [0, 80] and versions[1]["commit"] == "0" * 40
  # Two runs' records from two commits: the report's first lines say so.
  runs = [dict(code_versions=[provenance.label(now)]),
          dict(code_versions=[provenance.label(other)])]
  result = dict(study=dict(code_versions=study_json.code_versions(runs), seeds=[0]), lr_grid={})
  first = preamble.limits(result)[0]
  assert first.startswith("**Runs from 2 code versions**") and "0000000000" in first


CELL_REFUSALS = {  # a badly made derived cell or pair -> the words of its one-line refusal
    "dash": (dict(derived=(("t-x", "transformer"),), variants=("transformer", "t-x")),
             "derived cell 't-x' must be a new, unique name without '-'"),
    "cycle": (dict(derived=(("a", "b"), ("b", "a")), variants=("transformer", "a")),
              "must end at a registered variant, without a cycle"),
    "unregistered_root": (dict(derived=(("a", "nope"),), variants=("transformer", "a")),
                          "must end at a registered variant"),
    "lr_parent_not_compared": (dict(derived=(("a", "diff"),), variants=("transformer", "a")),
                               "trains at the lr of 'diff', which is not compared here"),
    "overrides_without_outer_tuple": (
        dict(derived=(("t@h2", "transformer", ("model.num_heads", 2)),),
             variants=("transformer", "t@h2")),
        "derived cell 't@h2': overrides must be a tuple of (key, value) pairs"),
    "factorial_unknown_cell": (
        dict(factorial=(("a", "b"), ("transformer", "diff", "diff_v2", "nope"))),
        "factorial must be ((factor A, factor B), (4 distinct compared cells"),
    "pair_unknown": (dict(comparisons=(("diff", "nope"),)), "must be two distinct names"),
    "pair_repeated": (dict(comparisons=(("diff", "transformer"), ("diff", "transformer"))),
                      "comparisons repeat a pair"),
    "published_cell_unknown": (dict(published_cells=(("nope", 1.0),)),
                               "published cell value ('nope', 1.0) must name a compared cell"),
    "published_unpaired": (dict(comparisons=(("diff", "transformer"),),
                                published=(("diff_v2", "transformer", 0.1),)),
                           "must name one of the comparisons"),
}


@pytest.mark.parametrize("case", sorted(CELL_REFUSALS))
def test_derived_cells_and_pairs_are_checked_before_any_run(case):
  from diff_transformer.study import Cell
  from diff_transformer.errors import ConfigError
  fields, words = CELL_REFUSALS[case]
  fields = dict(fields)
  fields["derived"] = tuple(Cell(*c) for c in fields.get("derived", ()))
  study = dataclasses.replace(retrieval(), **fields)
  with pytest.raises(ConfigError, match=re.escape(words)) as refused:
    study.validate(design=False)
  assert len(str(refused.value).splitlines()) == 1


def test_the_table6_study_names_its_cells_pairs_and_lrs():
  """Its six pairs resolve at 10 seeds; the ablations train at their parent's lr; its
  transformer and diff points are the LM study's very settings (their records are reused)."""
  table6 = cli.load_definition(str(ROOT / "configs/studies/lm_table6.py"), "study",
                               "STUDY").validate()
  lm = cli.load_definition(str(ROOT / "configs/studies/lm.py"), "study", "STUDY")
  assert table6.design()["primary"] == dict(comparisons=6, smallest_p=6 * 2 / 2 ** 10,
                                            can_resolve=True, seeds_needed=8)
  assert table6.grid_cells() == ["transformer", "diff", "transformer@2x64"]
  assert {v: table6.lr_source(v) for v in table6.variants if "@" in v} == {
      "transformer@2x64": "transformer@2x64", "transformer@2x64norm": "transformer@2x64",
      "diff@nosubln": "diff", "diff@lambda0.8": "diff", "diff@lambda0.5": "diff"}
  from diff_transformer.runs.record import setting
  for point in ("transformer-s3", "diff-s7", "transformer-lr0.004-s1000"):
    assert setting(table6.get_config(point)) == setting(lm.get_config(point)), point
  m = table6.get_config("transformer@2x64norm-s0").model
  assert (m.num_heads, m.head_dim, m.transformer.head_norm, m.variant) == (
      2, 64, True, "transformer")


def test_a_size_contrast_compares_the_gap_at_one_size_with_the_gap_at_another():
  """`loss@512-128` per seed is the loss at 512 minus at 128; a pair's a - b of it is the gap at
  512 minus the gap at 128, tested as one more metric (here the primary)."""
  study = dataclasses.replace(retrieval(), variants=("transformer", "diff"), seeds=(0, 1, 2),
                              sizes=("128", "512"), size_contrasts=(("512", "128"),),
                              primary="final_loss@512-128", secondary=())
  rng = np.random.default_rng(0)
  loss = {(v, z, s): float(rng.normal(2.0, 0.1)) for v in study.variants for z in study.sizes
          for s in study.seeds}
  runs = [dict(variant=v, size=z, seed=s, final_loss=x) for (v, z, s), x in loss.items()]
  runs = [r for r in runs if (r["variant"], r["size"], r["seed"]) != ("diff", "512", 2)]
  got = study_json.compare(study, runs)["diff"]["final_loss@512-128"]
  gaps = [(loss["diff", "512", s] - loss["transformer", "512", s]) -
          (loss["diff", "128", s] - loss["transformer", "128", s]) for s in (0, 1)]
  assert got["family"] == "primary" and got["n"] == 2  # seed 2 lacks diff at 512
  assert got["mean_diff"] == pytest.approx(np.mean(gaps))
  with pytest.raises(UserError, match=r"size contrast \('512', '256'\) must be two distinct"):
    dataclasses.replace(study, size_contrasts=(("512", "256"),)).validate(design=False)


def test_the_width_study_is_parameter_matched_at_every_width_with_v1s_heads_by_size():
  from diff_transformer import params
  from diff_transformer.model.attention import spec_from_config
  study = cli.load_definition(str(ROOT / "configs/studies/lm_width.py"), "study",
                              "STUDY").validate()
  assert study.design()["primary"]["comparisons"] == 4 and study.primary == "loss@512-128"
  assert study.design()["primary"]["can_resolve"] and study.grid_by_primary
  for size in study.sizes:
    configs = {v: study.get_config(f"{study.cell_name(v, size)}-s0") for v in study.variants}
    counts = {v: params.count(spec_from_config(c.model))["params"]
              for v, c in configs.items()}
    assert max(counts.values()) / min(counts.values()) < 1.001, (size, counts)
    v1 = configs["transformer@v1heads"].model
    assert (v1.num_heads, v1.head_dim) == (configs["diff"].model.num_heads, 64)
    assert configs["transformer"].model.d_model == int(size)
    assert configs["diff@scale0.2"].model.diff.norm_out_scale == "0.2"


def test_the_pre_named_two_by_two_gives_main_effects_and_interaction_seed_by_seed():
  """Cell means 1.0 / 0.9 / 0.95 / 0.8 plus a per-seed offset: scale -0.125, lambda -0.075,
  interaction -0.05, exactly, on the seeds all four cells ran (seed 2 lacks one cell)."""
  from configs.studies import lm_scale
  from diff_transformer.study import factorial
  study = lm_scale.STUDY
  means = dict(zip(study.factorial[1], (1.0, 0.9, 0.95, 0.8)))
  runs = [dict(variant=c, seed=s, size="", loss=m + 0.01 * s) for s in range(3)
          for c, m in means.items() if (s, c) != (2, "diff")]
  got = factorial.effects(study, runs)
  assert got["seeds"] == [0, 1]
  effects = {k: e["mean_diff"] for k, e in got["effects"].items()}
  assert effects == pytest.approx({"main effect of output scale 0.2": -0.125,
                                   "main effect of lambda_init 0.8": -0.075,
                                   "interaction": -0.05})
  text = "\n".join(factorial.report(dict(factorial=got, study=dict(primary="loss"))))
  assert "| lambda_init 0.8: yes | diff@lambda0.8scalerule: 0.955" in text
  assert "| interaction | -0.050" in text


def test_the_committed_tuned_study_records_every_compared_run_at_its_choice():
  """docs/results/study_lm_tuned/: every compared run of every cell on its own seeds recorded,
  each trained at its cell's chosen (output scale, lr) pair; the four pre-named pairs tested over
  all of those seeds with Holm; every unbracketed lr or tuned value flagged in the report."""
  from configs.studies import lm_tuned
  study = lm_tuned.STUDY
  folder = ROOT / "docs/results/study_lm_tuned"
  data = json.loads((folder / "study.json").read_text())
  grid = json.loads((folder / "lr_grid.json").read_text())
  text = (folder / "report.md").read_text()
  compared = {(r["variant"], r["seed"]): r for r in
              (json.loads(p.read_text()) for p in (folder / "records").glob("*.json"))}
  assert not data["missing"] and set(compared) == {
      (v, s) for v in study.variants for s in study.seeds_of(v)}
  value_of = {cell: value for c in grid["tuned"].values()
              for value, cell in c["candidates"].items()}
  for (variant, _), record in compared.items():  # at its candidate's value and grid lr
    tuned = grid["tuned"].get(variant)  # a tuned cell: the grid's choice; else its parent
    candidate = tuned["candidate"] if tuned else data["study"]["cells"][variant]["parent"]
    own = nested(record["setting"])  # committed records name the options flat
    assert (own[f"model.{own['model.variant']}.norm_out_scale"], record["lr"]) == (
        value_of[candidate], grid["chosen"][candidate]), variant
  for a, b in study.comparisons:
    loss = data["paired"][f"{a} vs {b}"]["loss"]
    assert loss["family"] == "primary" and "p_holm" in loss
    assert loss["n"] == len(set(study.seeds_of(a)) & set(study.seeds_of(b)))
  assert_unbracketed_choices_flagged(data, text)
  for cell, choice in grid["tuned"].items():
    if choice["at_end"]:
      assert cell in next(l for l in text.splitlines()
                          if l.startswith("**Tuned value not bracketed**"))
