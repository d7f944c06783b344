"""Regenerates the README's generated blocks (preset parameter table): `python tools/readme_tables.py`.

tests/test_readme.py fails when the README's block differs from what this prints, so the table
is always the code's count, never typed by hand.
"""
from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from configs import scaling  # noqa: E402
from diff_transformer import params  # noqa: E402
from diff_transformer.model.spec import ModelSpec  # noqa: E402

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def preset_table() -> str:
  rows = ["| preset | D | L | heads | kv | d | FFN | rank | params | non-embedding | paper count |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
  for name in scaling.preset_names():
    m = scaling.get_config(name).model
    spec = ModelSpec.from_config(m)
    c = params.count(spec)
    rows.append(f"| `{name}` | {m.d_model} | {m.num_layers} | {m.num_heads} | {spec.kv_heads} | "
                f"{m.head_dim} | {m.ffn_dim} | {m.rank or '-'} | {c['params'] / 1e9:.3f}B | "
                f"{c['non_embedding_params'] / 1e9:.3f}B | {c['paper_params'] / 1e9:.3f}B |")
  return "\n".join(rows)


BLOCKS = {"presets": preset_table}


def render(text: str) -> str:
  for name, make in BLOCKS.items():
    pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(\n<!-- {name}:end -->)", re.S)
    text = pattern.sub(lambda m: m.group(1) + make() + m.group(2), text)
  return text


if __name__ == "__main__":
  with open(README) as f:
    text = f.read()
  with open(README, "w") as f:
    f.write(render(text))
  print("README.md blocks regenerated:", ", ".join(BLOCKS))
