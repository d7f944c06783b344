import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import readme_tables  # noqa: E402


@pytest.mark.parametrize("page", readme_tables.PAGES)
def test_generated_blocks_are_current(page):
  with open(os.path.join(ROOT, page)) as f:
    text = f.read()
  assert "<!--" in text and "begin -->" in text, f"{page} holds no generated block"
  assert readme_tables.render(text, page) == text, "run: python tools/readme_tables.py"


def test_readme_starts_with_the_two_commands_and_stays_a_map():
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  assert "pip install -e . && python train.py" in text[:600]
  assert 'pip install -e ".[test,tpu]" && python -m pytest -q -n 2' in text[:600]
  assert len(text.splitlines()) <= 300, "the README is the map; details go to docs/"
  assert "<!--" not in text  # generated tables live in docs/ pages
