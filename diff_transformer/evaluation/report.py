"""report.md for one run, and `--compare`: several runs side by side with overlaid plots."""
from __future__ import annotations

import math
from pathlib import Path

from diff_transformer.evaluation import common, icl, long_context, quantization
from diff_transformer.errors import EvalError, first_line
from diff_transformer.files import read_json
from diff_transformer.runs.folder import EVAL_REPORT, RunFolder


def metrics(name: str, r: dict) -> dict[str, object]:
  """The suite's key numbers, flat (one row each in the report and the comparison table)."""
  if name == "loss":
    return {"val loss": r["loss"], "perplexity": r["perplexity"],
            "AR-hit loss": r["ar_hit"]["loss"], "others loss": r["others"]["loss"],
            "AR-hit fraction": r["ar_hit"]["fraction"],
            **({"n-gram AR-hit loss": r["ar_hit"]["ngram_loss"],
                "n-gram others loss": r["others"]["ngram_loss"]}
               if r["ar_hit"].get("ngram_loss") is not None else {})}
  if name == "long_context":
    return {f"cum. NLL @{p}": v for p, v in r["cumulative_at"].items()}
  if name == "needle":
    return {f"accuracy {cfg}": v for cfg, v in r["mean_accuracy"].items()}
  if name == "task":
    return {"accuracy (trained)": r["accuracy"], "floor (best shortcut)": r["floor"],
            "first-query accuracy": r["by_query"][0],
            **{f"accuracy {k}": v["accuracy"] for k, v in r["slices"].items()
               if not k.startswith("trained")}}
  if name == "attention":
    spans = ("answer", "distractors", "noise") if "task" in r else ("answer", "noise",
                                                                     "other_needles")
    return {f"{k} share (mean)": r["averaged"][k] for k in spans}
  if name == "outliers":
    o = r["overall"]
    return {"logit top-1": o["attention_logits"]["top1"],
            "logit top-100": o["attention_logits"]["top100"],
            "logit median": o["attention_logits"]["median"],
            "hidden top-1": o["hidden_states"]["top1"],
            "hidden median": o["hidden_states"]["median"]}
  if name == "quantization":
    out = {}
    for bits, row in r["by_bits"].items():
      out[f"loss @{bits}"] = row["loss"]
      out[f"needle @{bits}"] = row["needle_accuracy"]
    return out
  if name == "icl":
    n = str(r["demos_max"])
    return {"demos (max)": r["demos_max"],
            "acc @max (random)": r["accuracy_vs_demos"]["random"][n],
            "acc @max (alternating)": r["accuracy_vs_demos"]["alternating"][n],
            "robustness (random)": r["robustness"]["random"],
            "robustness (alternating)": r["robustness"]["alternating"]}
  if name == "generate":
    return {"KV cache values/token": r["kv_cache"]["values_per_token"],
            "greedy = full forward": all(s["greedy_matches_full_forward"] for s in r["samples"])}
  return {}


def fmt(v) -> str:
  if isinstance(v, bool):
    return "yes" if v else "no"
  if isinstance(v, float):
    return "nan" if math.isnan(v) else f"{v:.4g}"
  return str(v)


def headline(name: str, result: dict) -> str:
  return ", ".join(f"{k} {fmt(v)}" for k, v in list(metrics(name, result).items())[:3])


def load(out_dir: Path) -> dict[str, dict]:
  """Every suite result in out_dir, each checked to hold the metrics the report reads."""
  results = {}
  for name in common.SUITES:
    path = out_dir / f"{name}.json"
    if path.is_file():
      results[name] = read_json(path, EvalError, "eval result")
      try:
        metrics(name, results[name])
      except (KeyError, IndexError, TypeError, AttributeError, StopIteration) as e:
        what = f"missing key {e}" if isinstance(e, KeyError) else first_line(e)
        raise EvalError(f"{path}: not a whole {name} result ({what}); run eval.py again") from None
  return results


def _table(header: list[str], rows: list[list]) -> list[str]:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  return lines + ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]


def _details(name: str, r: dict) -> list[str]:
  if name == "needle":
    lines = []
    for cfg, per_len in r["accuracy"].items():
      depths = list(next(iter(per_len.values())))
      lines += [f"{cfg}, {r['samples_per_cell']} samples per cell:", ""]
      lines += _table(["length"] + [f"depth {float(d):.0%}" for d in depths],
                      [[L] + [per_len[L][d] for d in depths] for L in per_len]) + [""]
    return lines + [f"Protocol: {r['protocol']}."]
  if name == "task":
    kinds = list(next(iter(r["slices"].values()))["chance"])
    rows = [[k, v["accuracy"]] + [v["chance"][c] for c in kinds] +
            [" ".join(f"{a:.2f}" for a in v["by_query"])] for k, v in r["slices"].items()]
    return (_table(["slice", "accuracy"] + [f"floor: {c}" for c in kinds] +
                   ["accuracy by query position"], rows) +
            ["", f"{next(iter(r['slices'].values()))['rows']} eval-split rows per slice; floors: "
             "a shortcut's expected accuracy on the same rows (evaluation/floors.py)."])
  if name == "attention" and "task" in r:
    spans = list(next(iter(r["by_layer"].values())))
    rows = [[layer] + [t[k] for k in spans] + [r["by_layer_abs"][layer][k] for k in spans] +
            [sum(r["by_layer_negative"][layer].values())] for layer, t in r["by_layer"].items()]
    return (_table(["layer"] + spans + [f"|{k}|" for k in spans] + ["negative mass"], rows) +
            ["", f"Map: {r['map']}. {r['rows']} rows. Normalisation: {r['normalisation']}"])
  if name == "attention":
    rows = [[f"{float(d):.0%}", t["mean"]["answer"], t["mean"]["noise"],
             t["mean"]["other_needles"]] for d, t in r["by_depth"].items()]
    return (_table(["depth", "answer", "noise", "other needles"], rows) +
            ["", f"Map: {r['map']}. Normalisation: {r['normalisation']}"])
  if name == "outliers":
    keys = ("top1", "top2", "top3", "top10", "top100", "median")
    rows = [[f"{layer} {kind.replace('_', ' ')}"] + [v[kind][k] for k in keys]
            for layer, v in {"overall": r["overall"], **r["per_layer"]}.items()
            for kind in ("attention_logits", "hidden_states") if kind in v]
    return _table(["", *keys], rows) + ["", r["definition"] + "."]
  if name == "quantization":
    return [f"Method: {r['method']}."]
  if name == "icl":
    return [f"Task: {r['task']}; labels {', '.join(r['labels'])} (chance {r['chance']:.2f}); "
            f"{r['test_examples']} test examples, {r['permutations']} permutations."]
  if name == "generate":
    return [f"- `{s['prompt']}` -> greedy `{s['greedy']}` / sampled `{s['sampled']}`"
            for s in r["samples"]]
  if name == "loss":
    return [f"{r['definition']}; {r['tokens']} target tokens."]
  return []


def write_report(out_dir: Path) -> Path:
  results = load(out_dir)
  if not results:
    raise EvalError(f"{out_dir}: no suite results to report")
  first = next(iter(results.values()))
  lines = [f"# Evaluation of {first['run']} (step {first['step']}, {first['variant']})", ""]
  for name, r in results.items():
    lines += [f"## {name}" + (" (quick)" if r.get("quick") else ""), ""]
    lines += _table(["metric", "value"], [[k, v] for k, v in metrics(name, r).items()]) + [""]
    lines += _details(name, r) + [""]
    lines += [f"![{name}]({p})" for p in r.get("plots", [])] + [""]
  path = out_dir / EVAL_REPORT
  path.write_text("\n".join(lines))
  return path


def compare(workdirs: list[str], out_dir: Path | None = None) -> Path:
  """One table of every run's suite metrics plus overlaid plots, in out_dir/compare.md."""
  if len(workdirs) < 2:
    raise EvalError("--compare: give at least two run directories")
  runs = {}
  for w in workdirs:
    res = load(RunFolder(w).eval_dir)
    if not res:
      raise EvalError(f"--compare: {RunFolder(w).eval_dir} holds no suite results; run "
                      f"`python eval.py --workdir {w}` first")
    runs[Path(w).name if Path(w).name not in runs else w] = res
  out_dir = out_dir or Path(workdirs[0]).parent / "compare"
  names = list(runs)
  lines = [f"# Comparison: {', '.join(names)}", ""]
  header = ["suite", "metric"] + [f"{n} ({next(iter(r.values()))['variant']})"
                                  for n, r in runs.items()]
  rows = []
  for suite in common.SUITES:
    keys: list[str] = []
    for r in runs.values():
      if suite in r:
        keys += [k for k in metrics(suite, r[suite]) if k not in keys]
    for k in keys:
      rows.append([suite, k] + [metrics(suite, r[suite]).get(k, "-") if suite in r else "-"
                                for r in runs.values()])
  lines += _table(header, rows) + [""]
  for plot in _overlays(runs, out_dir):
    lines += [f"![{plot}]({plot})", ""]
  path = out_dir / "compare.md"
  out_dir.mkdir(parents=True, exist_ok=True)
  path.write_text("\n".join(lines))
  common.write_json(out_dir, "compare",
                    {n: {s: metrics(s, v) for s, v in r.items()} for n, r in runs.items()})
  return path


def _overlays(runs: dict[str, dict], out_dir: Path) -> list[str]:
  have = lambda s: {n: r[s] for n, r in runs.items() if s in r}
  plots = []
  if have("long_context"):
    nll = {n: r["cumulative_nll"] for n, r in have("long_context").items()}
    plots.append(long_context.plot(nll, out_dir / "long_context.png"))
  if have("quantization"):
    plots.append(quantization.plot({n: r["by_bits"] for n, r in have("quantization").items()},
                                   out_dir / "quantization.png"))
  if have("icl"):
    plots.append(icl.plot({n: r["accuracy_vs_demos"] for n, r in have("icl").items()},
                          out_dir / "icl.png"))
  for suite, ylabel in (("needle", "needle accuracy"), ("attention", "attention share")):
    if have(suite):
      plots.append(_by_depth(suite, have(suite), ylabel, out_dir / f"{suite}.png"))
  return plots


def _by_depth(suite: str, results: dict[str, dict], ylabel: str, path: Path) -> str:
  """Needle accuracy (mean over lengths) or answer/noise shares against depth, one line each."""
  fig, ax = common.figure()
  for name, r in results.items():
    if suite == "needle":
      for cfg, per_len in r["accuracy"].items():
        depths = list(next(iter(per_len.values())))
        ys = [sum(per_len[L][d] for L in per_len) / len(per_len) for d in depths]
        ax.plot([float(d) for d in depths], ys, "o-", label=f"{name} {cfg}")
    else:
      depths = list(r["by_depth"])
      for k, style in (("answer", "o-"), ("noise", "s--")):
        ax.plot([float(d) for d in depths], [r["by_depth"][d]["mean"][k] for d in depths],
                style, label=f"{name} {k}")
  ax.set_xlabel("answer depth")
  ax.set_ylabel(ylabel)
  ax.legend(fontsize=7)
  return common.save_figure(fig, path)
