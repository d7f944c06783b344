"""Training: mesh and multi-host set-up, optimizer, jitted steps, checkpoints, metrics, loop.

Entry points: `train(config, workdir)` (what train.py runs) and
`restore_model(workdir, step=None, mesh=None, tokenizer=None) -> (model, config, step)`.
"""
from diff_transformer.errors import TrainError
from diff_transformer.training.checkpoint import restore_model
from diff_transformer.training.loop import train
from diff_transformer.training.mesh import initialize_distributed

__all__ = ["TrainError", "initialize_distributed", "restore_model", "train"]
