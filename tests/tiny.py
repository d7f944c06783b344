"""Tiny specs of every variant shared by the tests (GQA where the variant allows it)."""
from diff_transformer.model.spec import ModelSpec

BASE = dict(vocab_size=97, d_model=32, num_layers=2, ffn_dim=64, max_seq_len=64)
TINY = {
    "transformer": ModelSpec(variant="transformer", num_heads=4, num_kv_heads=2, head_dim=8, **BASE),
    "diff": ModelSpec(variant="diff", num_heads=2, num_kv_heads=1, head_dim=8, **BASE),
    "shared_diff": ModelSpec(variant="shared_diff", num_heads=2, num_kv_heads=1, head_dim=8, rank=4, **BASE),
    "diff_v2": ModelSpec(variant="diff_v2", num_heads=4, num_kv_heads=2, head_dim=8, **BASE),
}
