#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check/): every stage in its own process under its own time cap,
# so a crash or a hang in one stage leaves the others' JSON in the output folder.
#
#   bash tools/gpu_check.sh --fetch-wheels   # here (with pip access): the packages the GPU image
#                                            # lacks, as Python 3.12 wheels, into .whl/
#   bash tools/gpu_check.sh --job 1|2 [OUT]  # on the GPU machine, one time-limited job (its
#                                            # stages' caps add up to 8 minutes; default OUT: $OUT
#                                            # or benchmarks/results); installs .whl/ with --no-deps;
#                                            # its records in ONE archive, OUT/gpu_check_job<N>.tar.gz,
#                                            # rewritten after every stage (tar xzf it into
#                                            # benchmarks/results/)
#   bash tools/gpu_check.sh [OUT]            # every stage at its own cap (longer than one job)
#   bash tools/gpu_check.sh --job 1 --cpu [OUT]  # a job rehearsed at tiny shapes on any machine
#   DIFF_TRANSFORMER_CUDNN_LAYOUT=padded bash tools/gpu_check.sh --job 1
#                                            # the same, the cudnn path in its padded layout
#   GPU_CHECK_STAGES="kernels:150:--lengths=4096,8192+--tag=_long" bash tools/gpu_check.sh OUT
#                                            # chosen stages, caps and arguments
#   bash tools/gpu_check.sh --cpu [OUT]      # tiny shapes, Pallas interpreted, on any machine
#
# The packages and paths are tools/gpu_env.sh's (shared with tools/gpu_study.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/gpu_env.sh
if [[ "${1:-}" == "--fetch-wheels" ]]; then
  gpu_fetch_wheels
  exit
fi
MODE=() JOB=0
# The stages, their caps and the two jobs are benchmarks/gpu_check/stages.py's tables.
if [[ "${1:-}" == "--job" ]]; then JOB="${2:-}"; shift 2 || exit 2; fi
if [[ "${1:-}" == "--cpu" ]]; then MODE=(--cpu); shift; fi
if [[ "${1:-}" == -* || $# -gt 1 ]]; then  # refused before anything runs, naming what it got
  echo "error: gpu_check.sh: '${1}' is not an option here: give [--fetch-wheels] or" \
       "[--job 1|2] [--cpu] [OUT folder], in that order" >&2
  exit 2
fi
STAGES_PY=(python3 benchmarks/gpu_check/stages.py)  # plain Python: no jax, before gpu_env
PLAN="$("${STAGES_PY[@]}" --plan --job "$JOB" "${MODE[@]}")" || exit 2  # an unknown job: exit 2
read -r -a CAPS <<< "$PLAN"
if [[ -n "${GPU_CHECK_STAGES+set}" ]]; then  # e.g. "correctness:100 decode:60" for a rerun
  read -r -a CAPS <<< "$GPU_CHECK_STAGES"
fi
"${STAGES_PY[@]}" --check "${CAPS[@]}" || exit 2  # every entry named before any stage runs
OUT_DIR="${1:-${OUT:-benchmarks/results}}"
mkdir -p "$OUT_DIR"
STAGE_DIR="$OUT_DIR" ARCHIVE=""
if [[ "$JOB" != 0 ]]; then  # a job's output carries back few files: one archive of them all
  STAGE_DIR="$(mktemp -d)" ARCHIVE="$OUT_DIR/gpu_check_job$JOB.tar.gz"
fi
gpu_env /tmp/gpu_check_jax_cache "$([[ ${#MODE[@]} -gt 0 ]] && echo cpu)" || exit 1
FAILED=()
for entry in "${CAPS[@]}"; do
  # stage:seconds[:ARG+ARG...], e.g. kernels:150:--lengths=4096,8192+--tag=_long
  IFS=: read -r stage cap extra <<< "$entry"
  IFS=+ read -r -a EXTRA <<< "${extra:-}"
  flags="${XLA_FLAGS:-}"
  # Correctness compiles many programs and times none (on an H200 compiling, not running, took
  # most of that stage), so XLA need not autotune its GEMMs there.
  [[ "$stage" == correctness ]] && flags="$flags --xla_gpu_autotune_level=0"
  XLA_FLAGS="$flags" timeout --kill-after=10 "$cap" "$PYTHON" -m benchmarks.gpu_check \
    --stage "$stage" --out "$STAGE_DIR" --seconds "$cap" "${MODE[@]}" "${EXTRA[@]}"
  status=$?
  echo "== $stage exit status $status"
  if [[ -n "$ARCHIVE" ]]; then  # every finished stage is in the archive, whatever comes next
    tar czf "$ARCHIVE.part" -C "$STAGE_DIR" . && mv "$ARCHIVE.part" "$ARCHIVE"
  fi
  [[ $status == 0 ]] || FAILED+=("$stage")
done
# Every stage ran and left its JSON; the status says whether one failed or hit its cap.
if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo "error: stages failed or hit their cap: ${FAILED[*]}" >&2
  exit 1
fi
