"""The DIFF paper's scaling grid (Table 10 sizes, 40K steps of 0.25M tokens) for every variant,
plus a token-budget grid on the 3B rows (for L(D): 10K ... 100K steps of 4M tokens).

    python sweep.py --sweep=configs/sweeps/table10.py --root=gs://bucket/sweeps --mode=print \
        --launcher="sbatch --nodes=4 --wrap"
"""
from configs.scaling import preset_size
from diff_transformer.sweeps.definition import Sweep

SIZES = ("830m", "1.4b", "2.8b", "6.8b", "13.1b")

SWEEP = Sweep(
    name="table10",
    sizes={**{s: preset_size(s) for s in SIZES}, "3b": preset_size("3b")},
    budgets={"40k": 40_000, "10k": 10_000, "25k": 25_000, "50k": 50_000, "100k": 100_000},
    grid=tuple((s, "40k") for s in SIZES) + tuple(("3b", b) for b in ("10k", "25k", "50k", "100k")),
)
get_config = SWEEP.get_config
