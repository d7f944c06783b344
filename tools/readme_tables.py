"""Regenerates the generated blocks of the docs pages: `python tools/readme_tables.py`.

The preset table is the code's parameter count; the other blocks render measured results
(benchmarks/results/*.json, docs/results/ as copied by tools/collect_results.sh).
tests/test_readme.py fails when a block differs from what this renders, so none is typed by hand.
Links are written relative to the repository root and rewritten for pages under docs/.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from configs import scaling  # noqa: E402
from diff_transformer import params  # noqa: E402
from diff_transformer.model.attention import spec_from_config  # noqa: E402
from diff_transformer.paths import write_atomic  # noqa: E402

PAGES = ("docs/configs.md", "docs/evaluation.md", "docs/sweeps.md", "docs/kernels.md",
         "docs/performance.md")


def preset_table() -> str:
  rows = ["| preset | D | L | heads | kv | d | FFN | rank | params | non-embedding | paper count |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
  for name in scaling.preset_names():
    m = scaling.get_config(name).model
    spec = spec_from_config(m)
    c = params.count(spec)
    rows.append(f"| `{name}` | {m.d_model} | {m.num_layers} | {m.num_heads} | {spec.kv_heads} | "
                f"{m.head_dim} | {m.ffn_dim} | {getattr(spec.options, 'rank', 0) or '-'} | "
                f"{c['params'] / 1e9:.3f}B | "
                f"{c['non_embedding_params'] / 1e9:.3f}B | {c['paper_params'] / 1e9:.3f}B |")
  return "\n".join(rows)


RESULTS = os.path.join(ROOT, "benchmarks", "results")


def _load(name: str):
  import json
  path = os.path.join(RESULTS, name)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def kernel_tables() -> str:
  d = _load("attention_kernels.json")
  if d is None:
    return "(not measured yet: python benchmarks/attention_kernels.py)"
  rows = [f"CPU ({d['cpu_shape']}; pallas = interpret mode), forward ms / compiled temp MiB:", "",
          "| variant | T | reference | xla | pallas |", "|---|---|---|---|---|"]
  cells = {}
  for r in d["cpu"]:
    if "fwd_ms" in r:
      cells[(r["variant"], r["T"], r["path"])] = f"{r['fwd_ms']:.0f} / {r['fwd_temp_mib']:.0f}"
  for variant, T in sorted({(v, t) for v, t, _ in cells}, key=lambda x: (x[0], x[1])):
    rows.append(f"| {variant} | {T} | " + " | ".join(cells.get((variant, T, p), "skipped")
                                                    for p in ("reference", "xla", "pallas")) + " |")
  rows += ["", "TPU v5e, compiled ahead of time with libtpu (not run), temp MiB forward / "
           "forward+backward:", "", "| variant | T | xla | pallas |", "|---|---|---|---|"]
  tpu = {}
  for r in d["tpu_aot"]:
    one = lambda name: (f"{r[f'{name}_temp_mib']:.0f}" if f"{name}_temp_mib" in r
                        else "out of memory")
    tpu[(r["variant"], r["T"], r["path"])] = f"{one('fwd')} / {one('fwd_bwd')}"
  for variant, T in sorted({(v, t) for v, t, _ in tpu}):
    rows.append(f"| {variant} | {T} | {tpu.get((variant, T, 'xla'), '-')} | "
                f"{tpu.get((variant, T, 'pallas'), '-')} |")
  return "\n".join(rows)


def aot_table() -> str:
  rows = _load("aot_v5p_2x2x1.json")
  if rows is None:
    return "(not compiled yet: see docs/sweeps.md)"
  out = ["| preset | mesh (data, fsdp, tensor) | batch/chip x T | arguments GiB | temporaries GiB "
         "| total GiB / HBM | status |", "|---|---|---|---|---|---|---|"]
  for r in rows:
    m = r["mesh"]
    largest = r.get("largest_fitting_per_device_batch", "?")
    status = (("fits" if r["fits"] else f"OOM (largest batch/chip that fits: {largest})")
              if r["compiled"] else r["error"][:60])
    out.append(f"| `{r['preset']}` | {m['data']}, {m['fsdp']}, {m['tensor']} | "
               f"{r['per_device_batch']} x {r['seq_len']} | {r['argument_gib']:.2f} | "
               f"{r['temp_gib']:.2f} | {r['total_gib']:.2f} / {r['hbm_gib']:.0f} | {status} |")
  return "\n".join(out)


def gpu_plan_table(files: str) -> str:
  """One row per preset, one column pair per GPU node file (aot_compile.py --all_presets on GPU
  nodes): what to launch with and its compiled peak against the usable memory."""
  plans = [(name, _load(name)) for name in files.split(",")]
  missing = [name for name, rows in plans if rows is None]
  if missing:
    return f"(not compiled yet: {', '.join(missing)}; aot_compile.py --all_presets --topology=...)"
  head = "| preset |" + "".join(
      f" {rows[0]['topology']}: launch | peak + margin / usable GiB |" for _, rows in plans)
  out = [head, "|---|" + "---|---|" * len(plans)]
  by_preset = [{r["preset"]: r for r in rows} for _, rows in plans]
  for preset in by_preset[0]:
    cells = []
    for table in by_preset:
      r = table.get(preset, {})
      launch = r.get("launch")
      if not launch:
        tried = [t for p in r.get("plans", []) for t in p["tried"] if t["compiled"]]
        least = min((t["total_gib"] for t in tried), default=float("nan"))
        cells += ["nothing fits on 2 nodes", f"{least:.1f} (least tried)"]
        continue
      gpus = launch["mesh"]["data"] * launch["mesh"]["fsdp"] * launch["mesh"]["tensor"]
      cells += [f"{gpus} GPUs, {launch['per_device_batch']} x {launch['micro_batches']}, "
                f"remat {launch['remat']}",
                f"{launch['total_gib']:.1f} + {launch['margin_gib']:.1f} / "
                f"{launch['usable_gib']:.1f}"]
    out.append(f"| `{preset}` | " + " | ".join(cells) + " |")
  return "\n".join(out)


def step_memory_table() -> str:
  """benchmarks/step_memory.py: each compiled cell now against the same cell compiled by the
  code under the file's other label."""
  data = _load("step_memory.json")
  if not data or "rows" not in data:
    return "(not compiled yet: python benchmarks/step_memory.py)"
  earlier_label = next((k for k in data if k != "rows"), None)
  earlier = {(r["variant"], r["document_mask"]): r
             for r in (data[earlier_label]["rows"] if earlier_label else [])}
  out = [f"| variant | rows | peak GiB ({earlier_label} -> now) | other kernels' GB |",
         "|---|---|---|---|"]
  for r in data["rows"]["rows"]:
    e = earlier.get((r["variant"], r["document_mask"]), {})
    arrow = lambda key, fmt: (f"{e[key]:{fmt}} -> " if key in e else "") + f"{r[key]:{fmt}}"
    out.append(f"| {r['variant']} | {'packed' if r['document_mask'] else 'causal'} | "
               f"{arrow('peak_gib', '.1f')} | {arrow('other_gb', '.0f')} |")
  return "\n".join(out)


def step_estimate_table() -> str:
  """benchmarks/step_estimate.py's predictions: each variant's tokens/s over the Transformer's."""
  data = _load("step_estimate.json")
  if not data:
    return "(not estimated yet: python benchmarks/step_estimate.py)"
  names = {"diff": "DIFF V1", "shared_diff": "Shared DIFF", "diff_v2": "DIFF V2"}
  out = ["| step | " + " | ".join(names.values()) + " | the DIFF paper (DIFF V1, 3B) |",
         "|---|" + "---|" * (len(names) + 1)]
  for row in data["predictions"]:
    ratio = row["tokens_per_s_vs_transformer"]
    step = (f"{row['size'].upper()}, {row['layers']}, {row['T'] // 1024}K, "
            f"{row['T'] * row['batch'] // 1024}K tokens" +
            (f", remat {row['remat']}" if row["remat"] != "none" else ""))
    cells = [f"{ratio[v]:.3f}" if v in ratio else "not estimated" for v in names]
    paper = row.get("paper_diff_vs_transformer")
    out.append(f"| {step} | " + " | ".join(cells) + f" | {paper if paper else '-'} |")
  return "\n".join(out)


def throughput_table() -> str:
  d = _load("throughput.json")
  if d is None:
    return "(not measured yet: python benchmarks/throughput.py)"
  a = d["args"]
  loads = [x for r in d["results"] for x in r["load_average_per_round"]]
  out = [f"{d['device']} x{d['devices']} ({d['cpu_count']} cores, host `{d['host']}`), D="
         f"{a['d_model']}, {a['layers']} layers, head width {a['head_dim']}, batch {a['batch']}, "
         f"parameter-matched by FFN width, kernel `{a['kernel']}`; {a['rounds']} interleaved "
         f"rounds of {a['steps']} steps; 1-minute load average "
         f"{min(loads):.1f}-{max(loads):.1f} during the run; peak "
         f"{d['peak_tflops_per_device']:.3f} TFLOP/s per device ({d['peak_source']}); "
         f"{d['seconds'] / 60:.0f} minutes. Ratio = tokens/s over the "
         "Transformer's in the same round: median [min-max] over rounds.", "",
         "| variant | T | params | train tok/s | train ratio | forward tok/s | forward ratio "
         "| MFU | HFU |", "|---|---|---|---|---|---|---|---|---|"]
  ratio = lambda s: f"{s['median']:.3f} [{s['min']:.2f}-{s['max']:.2f}]"
  for r in d["results"]:
    out.append(f"| {r['variant']} | {r['seq_len']} | {r['params'] / 1e6:.2f}M | "
               f"{r['tokens_per_s']:.0f} | {ratio(r['train_ratio'])} | "
               f"{r['forward_tokens_per_s']:.0f} | {ratio(r['forward_ratio'])} | "
               f"{100 * r['mfu']:.1f}% | {100 * r['hfu']:.1f}% |")
  return "\n".join(out)


def gpu_train_table(files: str) -> str:
  """The GPU check's train cells (benchmarks/results/<file>, comma-separated files), one row
  each in the order measured: tokens/s, its ratio to the Transformer's of the same group in the
  same round (median [min-max] over rounds), MFU; a cell not measured says why."""
  rows = ["| T | group | variant | path | tokens/s | vs Transformer | MFU |",
          "|---|---|---|---|---|---|---|"]
  for name in files.split(","):
    d = _load(name)
    if d is None:
      return f"(not measured yet: benchmarks/results/{name})"
    for c in d["cells"]:
      head = f"| {c['T']} | {c['label']} | {c['variant']} | {c['runs']} |"
      if "tokens_per_s" not in c:
        rows.append(f"{head} {c.get('skipped') or c.get('error', 'not measured')} | | |")
        continue
      r = c.get("tokens_per_s_vs_transformer")
      ratio = f"{r['median']:.3f} [{r['min']:.2f}-{r['max']:.2f}]" if r else "-"
      rows.append(f"{head} {c['tokens_per_s']:,.0f} | {ratio} | {100 * c['mfu']:.1f}% |")
  return "\n".join(rows)


def _text(relative: str, missing: str) -> str:
  path = os.path.join(ROOT, relative)
  if not os.path.exists(path):
    return missing
  with open(path) as f:
    return f.read().strip()


def eval_report() -> str:
  """The default run's eval report, copied from runs/default/eval by tools/collect_results.sh."""
  return _text("docs/results/default_eval/report.md",
               "(not produced yet: python eval.py --workdir runs/default --quick)")


def sweep_report() -> str:
  body = _text("docs/results/sweep_cpu/report.md",
               "(not run yet: python sweep.py --sweep=configs/sweeps/cpu.py)")
  plots = [f"![{n}](docs/results/sweep_cpu/{n}.png)" for n in ("loss_vs_N", "loss_vs_D")
           if os.path.exists(os.path.join(ROOT, "docs/results/sweep_cpu", f"{n}.png"))]
  return body + ("\n\n" + " ".join(plots) if plots else "")


BLOCKS = {"presets": preset_table, "kernels": kernel_tables, "aot": aot_table,
          "step_memory": step_memory_table, "step_estimate": step_estimate_table,
          "throughput": throughput_table, "eval_report": eval_report, "sweep": sweep_report}


# Blocks that name their inputs: <!-- gpu_train:a.json,b.json:begin --> ... :end -->
BLOCKS_WITH_ARGUMENT = {"gpu_train": gpu_train_table, "gpu_plan": gpu_plan_table}


def render(text: str, page: str = "README.md") -> str:
  """`text` with every block present rendered; links made relative to `page`'s folder."""
  relative = (lambda s: s.replace("](docs/", "](")) if page.startswith("docs/") else (lambda s: s)
  for name, make in BLOCKS.items():
    pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
    text = pattern.sub(lambda m: m.group(1) + relative(make()) + "\n" + m.group(2), text)
  for name, make_for in BLOCKS_WITH_ARGUMENT.items():
    pattern = re.compile(rf"(<!-- {name}:([^:]+):begin -->\n).*?(<!-- {name}:\2:end -->)", re.S)
    text = pattern.sub(lambda m: m.group(1) + relative(make_for(m.group(2))) + "\n" + m.group(3),
                       text)
  return text


if __name__ == "__main__":
  rendered = {}
  for page in PAGES:  # every page rendered before any is written: a failing block loses none
    with open(os.path.join(ROOT, page)) as f:
      rendered[page] = render(f.read(), page)
  for page, text in rendered.items():
    write_atomic(Path(ROOT) / page, text)
  print("blocks regenerated in", ", ".join(PAGES))
