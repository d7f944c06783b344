"""AOT compile of the full sharded train step for a v5e:2x2 TPU slice (libtpu, no TPU): a narrow
2-layer cut of the 830M DIFF preset on every run, and the 830M preset itself with --run-long."""
import pytest

pytest.importorskip("libtpu", reason="the tpu extra (pip install -e '.[tpu]') provides libtpu")

from configs import scaling  # noqa: E402
from diff_transformer import aot, params  # noqa: E402
from diff_transformer.config import validate  # noqa: E402
from diff_transformer.model.attention import set_model, spec_from_config  # noqa: E402

GIB = 1024 ** 3


def preset_on_v5e_2x2(seq_len: int = 2048, **model):
  c = scaling.get_config("diff-830m")
  c.data.seq_len = c.model.max_seq_len = seq_len
  c.mesh.data, c.mesh.fsdp = 1, -1
  c.model.remat = "full"
  set_model(c.model, **model)
  # kernel='auto' (the preset's): aot.py resolves it for the TPU, i.e. the fused Pallas kernel.
  assert c.model.kernel == "auto"
  c.train.global_batch_size = 4  # one sequence per chip
  return validate(c)


def compile_and_check(config):
  result = aot.compile_train_step(config, "v5e:2x2")
  assert result.compiled, result.error
  assert result.mesh == {"data": 1, "fsdp": 4, "tensor": 1}
  assert result.seq_len == config.data.seq_len and result.per_device_batch == 1
  # Parameters + AdamW moments (3 x 4 bytes each) sharded over the 4 chips; the few replicated
  # vectors (norm gains, lambdas) and the batch add under 1%.
  n = params.count(spec_from_config(config.model))["params"]
  assert 1.0 <= result.argument_gib / (12 * n / 4 / GIB) < 1.01, (result.argument_gib, n)
  assert 0 < result.total_gib < result.hbm_gib == 16.0 and result.fits
  return result


def test_narrow_diff_compiles_for_v5e_2x2():
  """The 830M preset's vocabulary, heads of 96 and kernel, 2 layers of width 192, 256 tokens."""
  heads = params.heads_for("diff", 192, scaling.get_config("diff-830m").model.head_dim)
  compile_and_check(preset_on_v5e_2x2(256, d_model=192, num_heads=heads, num_kv_heads=heads,
                                      num_layers=2, ffn_dim=512))


@pytest.mark.long
def test_diff_830m_compiles_for_v5e_2x2_within_hbm():
  result = compile_and_check(preset_on_v5e_2x2())
  assert result.seq_len == 2048
  assert 2.5 < result.argument_gib < 3.2  # 0.988B parameters: ~2.8 GiB per chip


def test_unknown_topology_is_one_line():
  with pytest.raises(RuntimeError, match="--topology: cannot get TPU topology 'v9x:1x1'"):
    aot.topology_devices("v9x:1x1")
