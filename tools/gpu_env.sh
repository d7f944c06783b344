# Sourced by tools/gpu_check.sh and tools/gpu_study.sh: the environment of a program on the GPU
# machine. The image's own jax, flax, optax, orbax and numpy are used as they are (its jax is
# newer than setup.py's range, so pip never resolves the project there); the packages it lacks
# come from .whl/ (copied with the checkout to the machine, which has no network; fetched with
# `bash tools/gpu_check.sh --fetch-wheels`), installed with --no-deps into a scratch folder; the
# project runs from PYTHONPATH.
GPU_WHEELS=(grain==0.2.18 array-record==0.8.6 ml-collections==1.1.0 tensorboardX==2.6.5
            portpicker==1.6.0)

gpu_fetch_wheels() {  # here, with pip access: the wheels above for Python 3.12, into .whl/
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "${GPU_WHEELS[@]}"
}

gpu_env() {  # $1: the persistent compile cache; $2: "cpu" keeps this machine's own packages
  PYTHON="${PYTHON:-python3}"
  if [[ "${2:-}" != cpu && -d .whl ]]; then
    local site
    site="$(mktemp -d)/site"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target "$site" .whl/*.whl || return 1
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$1}"
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 TF_CPP_MIN_LOG_LEVEL=2
  # The memory jax takes, set rather than jax's default 0.75: the launch fraction the compiled
  # fits assume for an H100 and an H200 (diff_transformer/aot/gpu.py Gpu.launch_fraction).
  export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}"
}
