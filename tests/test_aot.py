"""AOT compile of the full sharded 830M DIFF train step for a v5e:2x2 TPU slice (libtpu, no TPU)."""
import pytest

pytest.importorskip("libtpu", reason="the tpu extra (pip install -e '.[tpu]') provides libtpu")

from configs import scaling  # noqa: E402
from diff_transformer import aot  # noqa: E402
from diff_transformer.config import validate  # noqa: E402


def test_diff_830m_compiles_for_v5e_2x2_within_hbm():
  c = scaling.get_config("diff-830m")
  c.mesh.data, c.mesh.fsdp = 1, -1
  c.model.remat = "full"
  # kernel='auto' (the preset's): aot.py resolves it for the TPU, i.e. the fused Pallas kernel.
  assert c.model.kernel == "auto"
  c.train.global_batch_size = 4  # one 2048-token sequence per chip
  result = aot.compile_train_step(validate(c), "v5e:2x2")
  assert result.compiled, result.error
  assert result.mesh == {"data": 1, "fsdp": 4, "tensor": 1}
  assert result.seq_len == 2048 and result.per_device_batch == 1
  # Parameters + AdamW moments (3 x 4 bytes x 0.988B) sharded over 4 chips: ~2.8 GiB each.
  assert 2.5 < result.argument_gib < 3.2
  assert 0 < result.total_gib < result.hbm_gib == 16.0
  assert result.fits


def test_unknown_topology_is_one_line():
  with pytest.raises(RuntimeError, match="--topology: cannot get TPU topology 'v9x:1x1'"):
    aot.topology_devices("v9x:1x1")
