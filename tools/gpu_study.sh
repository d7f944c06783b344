#!/usr/bin/env bash
# A study on the GPU machine in one command of bounded length. study.py trains until SECONDS,
# then gets SIGTERM: every finished run keeps its record, a program cut off trains again next
# time. The results folder then comes back as one tarball (the device returns few files).
#
#   bash tools/gpu_study.sh SECONDS RESULTS STUDY_FLAGS...        # on the GPU machine
#   bash tools/gpu_study.sh --cpu SECONDS RESULTS STUDY_FLAGS...  # the same on this machine
#
# e.g. as one job on a GPU machine without network (copy .whl and .cache beside the checkout;
# docs/synthetic.md, "A study in deadline-bounded jobs"):
#   bash tools/gpu_study.sh 480 docs/results/study_lm_width \
#     --study=configs/studies/lm_width.py --population=8 --jobs=1
# Writes to $OUT (or ./gpu_study_out): study.log (the driver's output) and study.tar.gz, the
# RESULTS folder under its own name (`tar -xzf study.tar.gz -C docs/results` puts it back, and
# its records are what the next call starts from: a recorded point never trains again). Exit
# status 0 when the study finished or stopped at the deadline, else the study's own (2: refused).
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_env.sh
MODE=""
if [[ "${1:-}" == "--cpu" ]]; then MODE=cpu; shift; fi
if [[ $# -lt 2 || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: bash tools/gpu_study.sh [--cpu] SECONDS RESULTS STUDY_FLAGS... (SECONDS: a positive" \
       "number of seconds)" >&2
  exit 2
fi
SECONDS_CAP="$1" RESULTS="$2"
shift 2
OUT_DIR="${OUT:-gpu_study_out}"
mkdir -p "$OUT_DIR" "$RESULTS"
gpu_env /tmp/gpu_study_jax_cache "$MODE" || exit 1
# The prepared corpus travels in .cache/ (no network there); the driver (it evaluates each run)
# and its children share the GPU, so none may take most of its memory up front.
[[ -d .cache/diff_transformer ]] && export DIFF_TRANSFORMER_CACHE="$PWD/.cache/diff_transformer"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
[[ "$MODE" == cpu ]] && export JAX_PLATFORMS=cpu
ROOT_DIR="$(mktemp -d)/root"
timeout --kill-after=60 "$SECONDS_CAP" "$PYTHON" study.py --root="$ROOT_DIR" \
  --results="$RESULTS" "$@" > "$OUT_DIR/study.log" 2>&1
status=$?
case $status in
  0) echo "== study finished: every point recorded" ;;
  124) echo "== study stopped at ${SECONDS_CAP} s; its finished runs are recorded" ;;
  *) echo "== study exit status $status (see study.log)" ;;
esac
tail -n 5 "$OUT_DIR/study.log"
tar -czf "$OUT_DIR/study.tar.gz" --exclude=driver.lock -C "$(dirname "$RESULTS")" \
  "$(basename "$RESULTS")"
echo "== $(find "$RESULTS/records" -name '*.json' 2>/dev/null | wc -l) records in $OUT_DIR/study.tar.gz"
# 0: finished, or stopped at the deadline (the next call goes on); else the study's own status
# (2: refused, 1: a failure), after packing what finished.
[[ $status == 0 || $status == 124 ]] && exit 0
exit "$status"
