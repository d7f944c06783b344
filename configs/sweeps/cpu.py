"""A scaling sweep that runs end to end on a 2-core CPU in well under an hour.

4 sizes (D = 64 ... 256, head width 32, DIFF h = D / 64, Transformer and DIFF V2 2h heads,
Shared DIFF rank 16) x the 4 variants at 200 steps of 16 x 128 tokens, plus 3 more token budgets
for the middle size (the L(D) fit). Tiny models need not show the papers' effect.

    python sweep.py --sweep=configs/sweeps/cpu.py --root=runs/sweeps/cpu
"""
from configs import default
from diff_transformer.config import ffn_width
from diff_transformer.params import heads_for, set_rank
from diff_transformer.sweeps.definition import Sweep

SIZES = {"xs": (64, 2), "s": (128, 2), "m": (192, 3), "l": (256, 4)}  # D, layers


def size(d_model: int, layers: int):
  def make(variant: str):
    c = default.get_config()
    m = c.model
    m.variant, m.d_model, m.num_layers, m.head_dim = variant, d_model, layers, 32
    m.num_heads = heads_for(variant, d_model, 32)
    m.ffn_dim = ffn_width(d_model, 64, up=True)
    set_rank(m, 16)
    m.max_seq_len = c.data.seq_len = 128
    c.train.global_batch_size = 16
    c.train.eval_every = c.train.checkpoint_every = 100
    c.train.eval_batches = 4
    c.source = f"CPU sweep size D={d_model}, L={layers}"
    return c
  return make


SWEEP = Sweep(
    name="cpu",
    sizes={name: size(*shape) for name, shape in SIZES.items()},
    budgets={"50": 50, "100": 100, "200": 200, "400": 400},
    grid=tuple((s, "200") for s in SIZES) + (("m", "50"), ("m", "100"), ("m", "400")),
)
get_config = SWEEP.get_config
