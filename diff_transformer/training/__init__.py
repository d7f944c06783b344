"""Training: mesh and multi-host set-up, optimizer, jitted steps, metrics, the loop.

Entry points: `train(config, workdir)` (what train.py runs) and
`population_loop.train_population(configs, workdirs)` (train.py --population: several runs of
one cell in one program); both step through training/schedule.py's one loop. A saved run (its
folder, record, lock, checkpoints, restored model) is `diff_transformer.runs`.
"""
from diff_transformer.errors import TrainError
from diff_transformer.training.loop import train
from diff_transformer.mesh import initialize_distributed

__all__ = ["TrainError", "initialize_distributed", "train"]
