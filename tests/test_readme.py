import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import readme_tables  # noqa: E402


def test_readme_generated_blocks_are_current():
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  assert "<!-- presets:begin -->\n|" in text
  assert readme_tables.render(text) == text, "run: python tools/readme_tables.py"


def test_readme_starts_with_the_two_commands():
  with open(os.path.join(ROOT, "README.md")) as f:
    head = f.read(600)
  assert "pip install -e . && python train.py" in head
  assert 'pip install -e ".[test,tpu]" && python -m pytest -q -n 2' in head
