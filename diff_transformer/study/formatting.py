"""Table cells of a study report: numbers, mean ± std, paired differences (bounds for censored
times, no p for descriptive metrics), markdown tables."""
from __future__ import annotations

import math


def plural(count: int, noun: str) -> str:
  return f"{count} {noun}{'' if count == 1 else 's'}"


def num(x: float | None, digits: int = 3) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "-"
  return f"{x:.0f}" if abs(x) >= 100 else f"{x:.{digits}f}"


def pm(s: dict | None) -> str:
  if not s or s["n"] == 0:
    return "- (n=0)"
  std = "" if math.isnan(s["std"]) else f" ± {num(s['std'])}"
  return f"{num(s['mean'])}{std} (n={s['n']})"


def signed(x: float) -> str:
  return "-" if math.isnan(x) else (f"{x:+.0f}" if abs(x) >= 100 else f"{x:+.3f}")


def diff(p: dict | None) -> str:
  """A paired entry: the mean difference (a bound when censored runs enter it; a t interval only
  for inferential, uncensored metrics), n, and p with its Holm-adjusted p unless descriptive."""
  if not p or p["n"] == 0:
    return "-"
  inferential = p.get("family", "primary") != "descriptive"
  if p.get("censored"):
    mean = ("not bounded (censored on both sides)" if p["bound"] == "undetermined" else
            f"{p['bound'] or ''} {signed(p['mean_diff'])}".strip())
    text = (f"{mean} (n={p['n']}; determined {p['n_determined']}: {p['earlier']} earlier, "
            f"{p['later']} later, {p['tied']} tied)")
  else:
    ci = ("" if not inferential or math.isnan(p["ci95_low"]) else
          f" [{signed(p['ci95_low'])}, {signed(p['ci95_high'])}]")
    text = f"{signed(p['mean_diff'])}{ci} (n={p['n']})"
  if not inferential:
    return text
  test = "sign test" if p.get("censored") else "sign-flip"
  return f"{text}, {test} p={num(p['p'])}, p_holm={num(p.get('p_holm', math.nan))}"


def table(header: list[str], rows: list[list]) -> list[str]:
  return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] +
          ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def against(result: dict) -> str:
  """What a study's paired differences are taken against, for table headings."""
  return ("per pre-named pair (a - b)" if result["study"].get("comparisons")
          else "vs the Transformer")


def pair_seeds(result: dict) -> dict[str, int]:
  """Each primary pair's number of paired seeds (the seeds both its cells have)."""
  primary = result["study"]["primary"]
  return {pair: e[primary]["n"] for pair, e in result.get("paired", {}).items()
          if e.get(primary, {}).get("family") == "primary" and e[primary].get("n")}


def seeds_phrase(result: dict) -> str:
  """'10 seeds', or where pairs differ '10 seeds and the 8 of `a vs b`'."""
  n = len(result["study"]["seeds"])
  fewer = {pair: k for pair, k in pair_seeds(result).items() if k != n}
  return plural(n, "seed") + "".join(f" and the {k} of `{pair}`" for pair, k in fewer.items())

