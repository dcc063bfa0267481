"""The rules for a node's GPU type and labels, shared by the agent (its flags), `rota up`
and the api (Register), so a value one accepts the others accept too.

A GPU type ("a100") and a label's key and value ("switch" = "s1") are short lowercase
words of [a-z0-9._-] that start with a letter or digit (as a job's `gpu_types` in
rota.core.jobspec): they end up in job specs (`gpu_types`), in table columns and in
JSON keys, where case or spaces would only make two spellings of one thing.
"""

from __future__ import annotations

import re

WORD = re.compile(r"[a-z0-9][a-z0-9._-]*")  # fullmatch: "$" would let a trailing newline in
MAX_TYPE_LENGTH = 32  # gpus.gpu_type is a VARCHAR(32)
MAX_LABEL_LENGTH = 63
MAX_LABELS = 32
SWITCH = "switch"  # the label that says which network switch a node hangs off


def word_problem(value: str, limit: int) -> str | None:
    """Why `value` is not a valid type, label key or label value; None when it is."""
    if not value:
        return "must not be empty"
    if len(value) > limit:
        return f"at most {limit} characters (got {len(value)})"
    if not WORD.fullmatch(value):
        return f"lowercase letters, digits, '.', '_' and '-', starting with a letter or digit (got {value!r})"
    return None


def type_problem(value: str) -> str | None:
    """Why `value` is not a GPU type; "" (unknown, e.g. an undeclared virtual slot) is allowed."""
    return None if value == "" else word_problem(value, MAX_TYPE_LENGTH)


def labels_problem(labels: dict[str, str]) -> tuple[str, str] | None:
    """(the offending key, why) for the first bad label; None when all are valid."""
    if len(labels) > MAX_LABELS:
        return "", f"at most {MAX_LABELS} labels (got {len(labels)})"
    for key in sorted(labels):
        problem = word_problem(key, MAX_LABEL_LENGTH)
        if problem is not None:
            return key, f"key {problem}"
        problem = word_problem(labels[key], MAX_LABEL_LENGTH)
        if problem is not None:
            return key, f"value {problem}"
    return None


def parse_label(text: str) -> tuple[str, str]:
    """"KEY=VALUE" -> (KEY, VALUE); ValueError saying what is wrong otherwise."""
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not sep:
        raise ValueError(f"{text!r} is not KEY=VALUE")
    problem = labels_problem({key: value})
    if problem is not None:
        raise ValueError(f"{text!r}: {problem[1]}")
    return key, value


def parse_labels(text: str) -> dict[str, str]:
    """"switch=s1,rack=r1" -> {"switch": "s1", "rack": "r1"}; "" -> {}. ValueError on a bad one."""
    labels: dict[str, str] = {}
    for part in text.split(","):
        if part.strip():
            key, value = parse_label(part)
            if key in labels:
                raise ValueError(f"{key!r} given twice")
            labels[key] = value
    return labels
