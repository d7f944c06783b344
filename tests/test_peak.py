"""The MFU peak: an explicit train.peak_tflops wins; otherwise a measured calibration, cached per
host, device kind and dtype (CPU has no table entry)."""
import json

from diff_transformer.training import peak


def test_calibration_is_positive_cached_and_overridden(tmp_path, monkeypatch):
  monkeypatch.setenv("DIFF_TRANSFORMER_CACHE", str(tmp_path))
  monkeypatch.setattr(peak, "CALIBRATION_SECONDS", 0.05)
  monkeypatch.setattr(peak, "CALIBRATION_SIZES", {"cpu": (128,)})
  measured, source = peak.peak_tflops_per_device(0.0, "float32")
  assert source == "measured" and measured > 0
  files = list((tmp_path / "peak").glob("*float32.json"))
  assert len(files) == 1 and json.loads(files[0].read_text())["tflops"] == measured
  assert peak.peak_tflops_per_device(0.0, "float32") == (measured, "measured, cached")
  assert peak.peak_tflops_per_device(2.5, "float32") == (2.5, "config")


def test_calibration_measures_a_matmul():
  assert peak.calibrate_tflops("float32", sizes=(64, 128), seconds=0.05) > 0
