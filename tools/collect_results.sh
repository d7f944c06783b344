#!/usr/bin/env bash
# Copies measured results from runs/ (ignored by git) into docs/results/ and regenerates the
# README blocks that show them. Run after `python eval.py --workdir runs/default --quick` and
# `python sweep.py --sweep=configs/sweeps/cpu.py` and the studies (`python study.py`).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f runs/default/eval/report.md ]; then
  mkdir -p docs/results/default_eval
  cp runs/default/eval/*.json docs/results/default_eval/
  for f in runs/default/eval/*.png; do [ -e "$f" ] && cp "$f" docs/results/default_eval/; done
  # Image links in the report are relative to the eval folder; make them relative to the README.
  sed 's#](\([a-z_0-9]*\.png\))#](docs/results/default_eval/\1)#g' runs/default/eval/report.md \
    | sed "s/^#/###/" > docs/results/default_eval/report.md
fi
if [ -f runs/sweeps/cpu/report.md ]; then
  mkdir -p docs/results/sweep_cpu
  cp runs/sweeps/cpu/results.json runs/sweeps/cpu/*.png docs/results/sweep_cpu/
  sed "s/^#/###/" runs/sweeps/cpu/report.md > docs/results/sweep_cpu/report.md
fi
for study in retrieval lm; do
  if [ -f "runs/studies/$study/report.md" ]; then
    mkdir -p "docs/results/study_$study"
    cp "runs/studies/$study/study.json" "runs/studies/$study/report.md" \
      "runs/studies/$study"/*.png "docs/results/study_$study/"
    for extra in lr_grid.json invocations.jsonl; do
      if [ -f "runs/studies/$study/$extra" ]; then cp "runs/studies/$study/$extra" "docs/results/study_$study/"; fi
    done
  fi
done
python tools/readme_tables.py
