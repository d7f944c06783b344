"""Training: mesh and multi-host set-up, optimizer, jitted steps, checkpoints, metrics, loop.

Entry points: `train(config, workdir)` (what train.py runs),
`restore_model(workdir, step=None, mesh=None, tokenizer=None) -> (model, config, step)` and
`export_run(workdir, out, step=None)` (what export.py runs).
"""
from diff_transformer.errors import TrainError
from diff_transformer.training.loop import train
from diff_transformer.training.mesh import initialize_distributed
from diff_transformer.training.restore import export_run, restore_model

__all__ = ["TrainError", "export_run", "initialize_distributed", "restore_model", "train"]
