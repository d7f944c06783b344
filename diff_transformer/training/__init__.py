"""Training: mesh and multi-host set-up, optimizer, jitted steps, metrics, the loop.

Entry point: `train(config, workdir)` (what train.py runs). A saved run (its folder, record,
lock, checkpoints, restored model) is `diff_transformer.runs`.
"""
from diff_transformer.errors import TrainError
from diff_transformer.training.loop import train
from diff_transformer.mesh import initialize_distributed

__all__ = ["TrainError", "initialize_distributed", "train"]
