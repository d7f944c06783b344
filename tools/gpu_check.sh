#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): every stage in its own process under its own time cap,
# so a crash or a hang in one stage leaves the others' JSON in the output folder.
#
#   bash tools/gpu_check.sh --fetch-wheels   # here (with pip access): the packages the GPU image
#                                            # lacks, as Python 3.12 wheels, into .whl/
#   bash tools/gpu_check.sh [--part 1|2] [OUT]  # on the GPU machine (default OUT: $OUT or
#                                            # benchmarks/results); installs .whl/ with --no-deps
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
MODE=()
# Stage caps in seconds. Compiling dominates on the GPU (measured on an H200: 12 attention
# programs 42-56 s, 16 train steps 38-61 s, 16 decode programs 34-40 s), so the stages split into
# two jobs of about 5.5 minutes each: --part 1 and --part 2. env: 12 s warm, over 20 s cold.
CAPS=(env:40 decode:120 correctness:170 kernels:150 train:150 profile:80 tests:60)
case "${1:-}" in
  --part) [[ "$2" == 1 ]] && CAPS=("${CAPS[@]:0:3}") || CAPS=("${CAPS[@]:3}"); shift 2 ;;
esac
if [[ "${1:-}" == "--cpu" ]]; then
  MODE=(--cpu); shift
  CAPS=(env:120 correctness:240 kernels:240 train:240 profile:240 decode:240 tests:60)
fi
if [[ -n "${GPU_CHECK_STAGES:-}" ]]; then  # e.g. "correctness:100 decode:60" for a rerun
  read -r -a CAPS <<< "$GPU_CHECK_STAGES"
fi
KNOWN=" env decode correctness kernels train profile tests "
for entry in "${CAPS[@]}"; do  # every entry checked before any stage runs
  IFS=: read -r stage cap extra <<< "$entry"
  if [[ "$KNOWN" != *" $stage "* || ! "$cap" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: GPU_CHECK_STAGES entry '$entry' is not stage:seconds[:ARG+ARG...] with a stage among" \
      "${KNOWN% } and a positive number of seconds" >&2
    exit 2
  fi
done
OUT_DIR="${1:-${OUT:-benchmarks/results}}"
mkdir -p "$OUT_DIR"
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
  XLA_FLAGS="$flags" timeout --kill-after=10 "$cap" "$PYTHON" benchmarks/gpu_check.py \
    --stage "$stage" --out "$OUT_DIR" --seconds "$cap" "${MODE[@]}" "${EXTRA[@]}"
  status=$?
  echo "== $stage exit status $status"
  [[ $status == 0 ]] || FAILED+=("$stage")
done
# Every stage ran and left its JSON; the status says whether one failed or hit its cap.
if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo "error: stages failed or hit their cap: ${FAILED[*]}" >&2
  exit 1
fi
