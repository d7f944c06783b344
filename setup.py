from setuptools import find_packages, setup

setup(
    name="diff-transformer",
    version="0.1.0",
    description="JAX/Flax NNX research codebase for differential-attention Transformers "
                "(DIFF V1, Shared DIFF, DIFF V2) and their Transformer baseline.",
    packages=find_packages(include=["diff_transformer", "diff_transformer.*", "configs",
                                    "configs.*"]),
    python_requires=">=3.10",
    # Ranges tested here: jax 0.10.2, flax 0.12.8, optax 0.2.8, orbax-checkpoint 0.12.8,
    # grain 0.2.18, ml-collections 1.1.0, chex 0.1.92 (Python 3.11, CPU); jax 0.11.2 with
    # flax 0.12.12 (the CPU suite, Python 3.12) and with flax 0.12.10 and orbax-checkpoint
    # 0.12.4 on an NVIDIA H200 (benchmarks/results/gpu_check_*.json); jax 0.12.0.1 with flax
    # 0.12.12 (the CPU suite, Python 3.12: CI's second leg).
    install_requires=[
        "jax>=0.10.2,<0.13",
        "flax>=0.12.8,<0.13",
        "optax>=0.2.8,<0.3",
        "orbax-checkpoint>=0.12.8,<0.13",
        "grain>=0.2.18,<0.3",
        "array-record>=0.8.6",
        "ml-collections>=1.1.0,<2",
        "chex>=0.1.92,<0.2",
        "absl-py>=2.1",
        "numpy>=1.26",
        # ml_dtypes 0.7.0 beside numpy 2.4 (the newest numpy for Python 3.11) takes about 1 s of
        # CPU to import, in every program and child process; 0.6.0 takes 0.015 s (measured on a
        # 2-core AMD EPYC host; 0.7.0 with numpy 2.5: 0.04 s). jax up to 0.12 asks for >=0.5.
        "ml-dtypes>=0.5,<0.7",
        "tokenizers>=0.21",
        "tqdm>=4.66",
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
        "scipy>=1.11",
    ],
    extras_require={
        # xdist 3.8: --no-loadscope-reorder (pytest.ini); filelock: test runs shared by workers
        # wheel: tests/test_packaging.py builds the wheel offline (--no-build-isolation)
        # pyflakes: tests/test_code_style.py (tested: 4.1.0)
        "test": ["pytest>=8", "pytest-xdist>=3.8", "filelock>=3.12", "wheel>=0.40", "mypy>=1.13",
                 "pyflakes>=3.2"],
        "tpu": ["jax[tpu]>=0.10.2,<0.11"],
        "cuda12": ["jax[cuda12]>=0.10.2,<0.13"],
        "cuda13": ["jax[cuda13]>=0.10.2,<0.13"],  # the H200 check ran jax 0.11.2 with CUDA 13
        # Compiling for NVIDIA GPUs on a host without one (aot_compile.py --topology=h100:8):
        # jax's CUDA plugin of the installed jax and ptxas, not the CUDA runtime (about 230 MB).
        # Tested: jax 0.10.2 (Python 3.11) and 0.12.0.1 (Python 3.12), nvidia-cuda-nvcc-cu12 12.9.
        "gpu-aot": ["jax[cuda12-local]>=0.10.2,<0.13", "nvidia-cuda-nvcc-cu12>=12.4,<13"],
        # Hugging Face export/import, lm-eval and tiktoken files. Tested: transformers 5.23.0 with
        # torch 2.13.0+cpu and transformers 5.24.0 with torch 2.14.1; safetensors 0.8.0, lm-eval
        # 0.4.13, accelerate 1.15.0 (lm-eval's hf model needs it), tiktoken 0.14.0. For the CPU
        # build of torch add --extra-index-url https://download.pytorch.org/whl/cpu.
        "hf": ["transformers>=5.23,<6", "torch>=2.13,<3", "safetensors>=0.8,<0.9",
               "lm-eval>=0.4.13,<0.5", "accelerate>=1.15,<2", "tiktoken>=0.14,<0.15"],
    },
)
