"""The JSON type of every config.json field npas reads from a Hugging Face checkpoint, checked first.

`hf_source.hf_chassis` turns config.json into a chassis with `int(...)`, `float(...)` and comparisons.
On a field of the wrong type those either crash (`"64" < 32`, `dict("linear")`) or, worse, succeed
with another meaning: `int(16.5)` is 16, `bool("false")` is True, `int(True)` is 1. transformers
itself would keep such a value and fail later, deep inside a forward pass. So each field is checked
against the type transformers' config classes give it, and a file with a wrong one is refused in one
line that names the field, the value and the fix, before a tensor is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from npas.errors import ConfigError, format_problems


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_str_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(a, str) for a in v)


# kind -> (what a value of it is called in a message, the test)
_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("an integer", _is_int),
    "number": ("a number", _is_number),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "mapping": ("a JSON object", lambda v: isinstance(v, dict)),
    "str_list": ("a list of class names", _is_str_list),
}
# field -> (kind, whether JSON null is allowed: the field then takes its default)
FIELDS: dict[str, tuple[str, bool]] = {
    "architectures": ("str_list", True),
    "vocab_size": ("int", False),
    "hidden_size": ("int", False),
    "intermediate_size": ("int", False),
    "num_hidden_layers": ("int", False),
    "num_attention_heads": ("int", False),
    "num_key_value_heads": ("int", True),  # null: as many as the query heads
    "head_dim": ("int", True),  # null: hidden_size // num_attention_heads
    "max_position_embeddings": ("int", False),
    "sliding_window": ("int", True),  # null: no window
    "use_sliding_window": ("bool", True),
    "rms_norm_eps": ("number", False),
    "rope_theta": ("number", True),
    "rope_scaling": ("mapping", True),  # null: the default rotary embedding
    "rope_parameters": ("mapping", True),
    "tie_word_embeddings": ("bool", False),
    "attention_bias": ("bool", False),
    "mlp_bias": ("bool", False),
    "hidden_act": ("str", False),
}
# inside rope_scaling / rope_parameters
ROPE_FIELDS: dict[str, tuple[str, bool]] = {
    "rope_type": ("str", False), "type": ("str", False), "rope_theta": ("number", False),
    "factor": ("number", True), "low_freq_factor": ("number", True), "high_freq_factor": ("number", True),
    "original_max_position_embeddings": ("int", True),
}


def _show(v: Any) -> str:
    return "null" if v is None else f"{v!r} ({type(v).__name__})"


def field_problems(config: dict[str, Any]) -> list[str]:
    """Every field of `config` (a parsed config.json) whose JSON type is not the one npas reads."""
    problems = []

    def check(table: dict[str, tuple[str, bool]], d: dict[str, Any], prefix: str) -> None:
        for key, (kind, nullable) in table.items():
            if key not in d or (d[key] is None and nullable):
                continue
            what, ok = _KINDS[kind]
            if not ok(d[key]):
                problems.append(f"{prefix}{key} must be {what}, got {_show(d[key])}")

    check(FIELDS, config, "")
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(config.get(key), dict):
            check(ROPE_FIELDS, config[key], f"{key}.")
    return problems


def check_fields(config: dict[str, Any], where: str) -> None:
    """Refuse a config.json with a field of the wrong type, naming each such field."""
    problems = field_problems(config)
    fix = "fix config.json or re-save the model with save_pretrained"
    if len(problems) == 1:
        raise ConfigError(f"{where}: {problems[0]}; {fix}")
    if problems:
        raise ConfigError(format_problems(f"{where} ({fix})", problems))


__all__ = ["FIELDS", "check_fields", "field_problems"]
