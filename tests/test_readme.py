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
  assert "pip install -e . && python train.py" in text[:1000]
  # The test command is what .ci/run does: its installs, in order, then the suite.
  with open(os.path.join(ROOT, ".ci", "run")) as f:
    ci = [l.replace("python -m pip install -q", "pip install").replace('"torch==2.13.0"',
                                                                       "torch==2.13.0")
          for l in f.read().splitlines() if l.startswith("python -m ")]
  assert " && ".join(ci) in text[:1000], ci
  assert len(text.splitlines()) <= 300, "the README is the map; details go to docs/"
  assert "<!--" not in text  # generated tables live in docs/ pages
