"""A saved run, at rest: its folder and the one place that names its files (`folder.py`), its
record (config, tokenizer record and copies, code versions, setting: `record.py`), its lock
(`lock.py`), its checkpoints (`checkpoint.py`, orbax errors in `orbax_errors.py`), the shapes a
checkpoint restores into (`layout.py`) and its restored model (`restore.py`). Training writes
runs; evaluation, export, lm-eval, the launcher and the drivers read them through here."""
