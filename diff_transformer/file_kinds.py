"""What each JSON file a program reads must hold: its shape, and the type and range of every field
a reader uses, nested fields included. `files.read_json(path, error, kind)` and
`files.read_jsonl` check a file against `KINDS[kind]` before any reader looks inside, so a
wrong value is one line naming the file and the key, never an exception deep in the code that
trusted it. Every number declared here must be finite (JSON's NaN and Infinity are refused).

The damage test (tests/test_damaged_files.py) damages each kind in every way, every declared
field included, and reads it as the program that reads it does.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Union

_TYPE_NAMES = {dict: "a JSON object", list: "a JSON list", str: "a string", int: "an integer",
               float: "a number", bool: "true or false"}


@dataclasses.dataclass(frozen=True)
class Field:
  """One key's value: its JSON type (or an object's Shape); where it matters its range (`above`,
  exclusive; `at_least`, inclusive: for a list, its length), its `choices`, and `each`, the type
  or Shape of every list item; `optional` keys may be absent (or null)."""
  kind: Union[type, "Shape"]
  above: float | None = None
  at_least: float | None = None
  choices: tuple = ()
  each: Union[type, "Shape", None] = None
  optional: bool = False


@dataclasses.dataclass(frozen=True)
class Shape:
  """What a JSON file (or one of its objects) must hold: `top` (object or list); an object's
  `keys`, each a (name, type | Shape | Field); `values`: the shape of every value of an object
  keyed by names of its own; `each`: the shape of every item of the list (the file itself, or
  its key `each_in`); `lines`: the file is JSON lines, every row of shape `each`."""
  top: type = dict
  keys: tuple[tuple[str, Any], ...] = ()
  values: Any = None
  each: "Shape | None" = None
  each_in: str = ""
  lines: bool = False


def field(spec: Any) -> Field:
  """A key's declaration as a Field (a bare type or Shape is a required key of that kind)."""
  return spec if isinstance(spec, Field) else Field(spec)


POSITIVE_INT = Field(int, above=0)
COUNT = Field(int, at_least=0)
_TOKENIZER = Shape(dict, (("name", str), ("vocab_size", POSITIVE_INT),
                          ("eot_id", Field(int, at_least=0, optional=True))))  # none: a task's
_SHARD = Shape(dict, (("file", str), ("index", str), ("documents", COUNT),
                      ("stream_tokens", COUNT), ("max_id", Field(int, at_least=0, optional=True))))
_SPLIT = Shape(dict, (("shards", Field(list, each=_SHARD, optional=True)),
                      ("file", Field(str, optional=True)), ("index", Field(str, optional=True)),
                      ("stream_tokens", Field(int, at_least=0, optional=True))))
_HF_SIZES = tuple((name, POSITIVE_INT) for name in (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"))
_KERNEL = Shape(dict, (("name", str), ("ms", Field(float, at_least=0)),
                       ("calls", Field(float, at_least=0)), ("hlo_op", Field(str, optional=True))))
_OBJECT = Shape()

KINDS: dict[str, Shape] = {
    # a workdir's record (runs/record.py, runs/folder.py); the run config's values then pass
    # config.validate, as a command line's do
    "run config": Shape(dict, (("model", dict), ("data", dict), ("train", dict))),
    "tokenizer record": _TOKENIZER,
    "code versions": Shape(list, each=Shape(dict, (("step", COUNT),))),
    "run summary": Shape(dict, (("step", COUNT),)),
    "eval result": Shape(dict, (("suite", str), ("step", COUNT), ("variant", str))),
    "metrics log": Shape(list, each=Shape(dict, (("step", COUNT), ("kind", str))), lines=True),
    # inputs of train.py and eval.py
    "prepared metadata": Shape(dict, (
        ("format", int), ("dtype", Field(str, choices=("uint16", "uint32"))),
        ("tokenizer", _TOKENIZER), ("splits", Shape(dict, values=_SPLIT)),
        ("unigram_entropy_nats", Field(float, at_least=0, optional=True)))),
    "members file": Shape(dict, (("members", Field(list, at_least=1)),),
                          each=Shape(dict, (("args", Field(list, each=str)),)), each_in="members"),
    "HF config": Shape(dict, _HF_SIZES + (
        ("architectures", Field(list, each=str, optional=True)),
        ("num_key_value_heads", Field(int, above=0, optional=True)),
        ("head_dim", Field(int, above=0, optional=True)),
        ("rms_norm_eps", Field(float, above=0, optional=True)),
        ("rope_theta", Field(float, above=0, optional=True)),
        ("rope_parameters", Field(Shape(dict, (
            ("rope_type", Field(str, optional=True)),
            ("rope_theta", Field(float, above=0, optional=True)))), optional=True)),
        ("tie_word_embeddings", Field(bool, optional=True)))),
    "HF index": Shape(dict, (("weight_map", Shape(dict, values=str)),)),
    "tokenizer file": _OBJECT,  # read by the tokenizers library, which checks the rest
    "tiktoken record": Shape(dict, (("encoding", str),)),
    # a study's results and the invocations that made them
    "study results": Shape(dict, (("study", Shape(dict, (
        ("command", Field(str, optional=True)), ("machine", Field(str, optional=True)),
        ("wall_seconds", Field(float, at_least=0, optional=True))))),)),
    "study invocations": Shape(list, each=Shape(dict, (
        ("command", str), ("wall_seconds", Field(float, at_least=0)),
        ("trained", COUNT))), lines=True),
    # the GPU check's kernel profile, read back by tools/hlo_kernels.py
    "GPU check profile": Shape(dict, (
        ("cells", Field(list, each=Shape(dict, (
            ("variant", str), ("kernels", Field(list, each=_KERNEL)),
            ("other_kernels", Field(list, each=_KERNEL, optional=True)))))),
        ("hlo", Field(Shape(dict, values=str), optional=True)))),
    # a measured matmul peak, cached per device (training/peak.py)
    "peak cache": Shape(dict, (("tflops", Field(float, above=0)),)),
}


def problem(value: Any, shape: Shape, where: str = "") -> str:
  """What is wrong with `value` against `shape` ('' when nothing is)."""
  if not _is(value, shape.top):
    return f"{where.rstrip('.') or 'the file'} is {kind_of(value)}, not {_TYPE_NAMES[shape.top]}"
  if shape.top is dict:
    for key, spec in shape.keys:
      why = _field_problem(value, key, field(spec), f"{where}{key}")
      if why:
        return why
    if shape.values is not None:
      for key, item in value.items():
        why = _value_problem(item, field(shape.values), f"{where}{key}")
        if why:
          return why
  if shape.each is not None:
    items = value[shape.each_in] if shape.each_in else value
    prefix = f"{where}{shape.each_in}" if shape.each_in else where.rstrip(".")
    for i, item in enumerate(items):
      why = problem(item, shape.each, f"{prefix}[{i}].")
      if why:
        return why
  return ""


def _field_problem(obj: dict, key: str, spec: Field, name: str) -> str:
  if obj.get(key) is not None:
    return _value_problem(obj[key], spec, name)
  if spec.optional:
    return ""
  return f"missing key '{name}'" if key not in obj else f"key '{name}' is null"


def _value_problem(value: Any, spec: Field, name: str) -> str:
  if isinstance(spec.kind, Shape):
    return problem(value, spec.kind, f"{name}.")
  if not _is(value, spec.kind):
    return f"key '{name}' is {kind_of(value)}, not {_TYPE_NAMES[spec.kind]}"
  if isinstance(value, float) and not math.isfinite(value):
    return f"key '{name}' is {value}, not a finite number"
  size = len(value) if isinstance(value, list) else value
  if spec.choices and value not in spec.choices:
    return f"key '{name}' is {value!r}, not one of {', '.join(map(str, spec.choices))}"
  if spec.above is not None and not size > spec.above:
    return f"key '{name}' is {value!r}; it must be > {spec.above:g}"
  if spec.at_least is not None and not size >= spec.at_least:
    if isinstance(value, list):
      return f"key '{name}' has {size} items; it needs at least {spec.at_least:g}"
    return f"key '{name}' is {value!r}; it must be >= {spec.at_least:g}"
  if spec.each is not None:
    for i, item in enumerate(value):
      why = _value_problem(item, field(spec.each), f"{name}[{i}]")
      if why:
        return why
  return ""


def _is(value: Any, kind: type) -> bool:
  if kind is int:
    return isinstance(value, int) and not isinstance(value, bool)
  if kind is float:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  return isinstance(value, kind)


def kind_of(value: Any) -> str:
  for kind, name in _TYPE_NAMES.items():
    if _is(value, kind):
      return name
  return "null" if value is None else type(value).__name__
