"""The accuracy floors of the synthetic tasks (evaluation/floors.py) against brute force."""
from __future__ import annotations

import itertools

import pytest

from diff_transformer.data import synthetic
from diff_transformer.evaluation import floors


def brute_force_mqar(g: int, R: int) -> dict[str, float]:
  """Every ordered choice of R asked pairs of the g x g grid; each shortcut guesses uniformly
  among its candidates, so a query scores 1 / |candidates|."""
  items = [(i // g, i % g) for i in range(g * g)]
  sums = dict.fromkeys(floors.KINDS, 0.0)
  orders = list(itertools.permutations(range(g * g), R))
  for asked in orders:
    for r, a in enumerate(asked):
      left = [i for i in range(g * g) if i not in asked[:r]]
      by_part = [[i for i in range(g * g) if items[i][p] == items[a][p]] for p in (0, 1)]
      sums["random"] += 1 / (g * g)
      sums["elimination"] += 1 / len(left)
      # Both key tokens are symmetric on the grid; the floor is the better one (equal here).
      sums["one_key"] += max(1 / len(c) for c in by_part)
      sums["one_key_elimination"] += max(1 / len([i for i in c if i in left]) for c in by_part)
  return {k: v / (len(orders) * R) for k, v in sums.items()}


@pytest.mark.parametrize("g, R", [(2, 2), (3, 4), (4, 8)])
def test_mqar_floors_match_brute_force(g, R):
  if g == 4:  # 16 * 15 * ... * 9 orders is too many to list: the closed forms instead
    exact = dict(random=1 / 16, elimination=sum(1 / (16 - r) for r in range(8)) / 8,
                 one_key=0.25, one_key_elimination=None)
  else:
    exact = brute_force_mqar(g, R)
  s = synthetic.TaskSpec(name="mqar", seq_len=3 * (g * g + R) + 8, vocab_size=256, num_keys=g,
                         num_queries=R)
  got = floors.row_floors(s, synthetic.generate(s, "val", 0, 0, 6000))
  assert got["random"] == pytest.approx(exact["random"])
  assert got["one_key"] == pytest.approx(exact["one_key"])  # exact on every row
  assert got["elimination"] == pytest.approx(exact["elimination"])  # exact: N - r left
  if exact["one_key_elimination"] is not None:  # a row average: sampling error only
    assert got["one_key_elimination"] == pytest.approx(exact["one_key_elimination"], abs=0.006)
  assert got["random"] < got["elimination"] < got["one_key_elimination"]
  assert got["one_key"] < got["one_key_elimination"]


def test_plain_mqar_has_no_partial_key():
  s = synthetic.TaskSpec(name="mqar", seq_len=64, vocab_size=128, compositional=False,
                         num_keys=8, num_queries=4)
  got = floors.row_floors(s, synthetic.generate(s, "val", 0, 0, 200))
  assert got["one_key"] == got["random"] == 1 / 8
  assert got["one_key_elimination"] == got["elimination"] == pytest.approx(
      sum(1 / (8 - r) for r in range(4)) / 4)


def test_needle_distractors_hold_one_key_models_at_the_floor():
  """With the key grid neither ka nor kb alone names the answer: one key scores 1/2; without
  distractors a single key suffices (floor 1, a slice that cannot separate anything)."""
  s = synthetic.TaskSpec(name="needle", seq_len=128, vocab_size=256, needles=4, asked=2,
                         distractors=2)
  got = floors.row_floors(s, synthetic.generate(s, "val", 0, 0, 300))
  assert got["one_key"] == got["one_key_elimination"] == 0.5
  assert got["random"] == pytest.approx(1 / 6)
  assert got["elimination"] == pytest.approx((1 / 6 + 1 / 5) / 2)
  none = synthetic.TaskSpec(name="needle", seq_len=128, vocab_size=256, needles=4, asked=2)
  assert floors.row_floors(none, synthetic.generate(none, "val", 0, 0, 50))["one_key"] == 1.0
  assert floors.highest(got) == 0.5
