"""Reading sbatch's options: `#SBATCH` lines at the top of a script, then the command line
(which wins). Every option Rota honours is in SUPPORTED; any other is refused by name, never
ignored (DirectiveError)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

# Long option -> its short form ("" when none). Each takes a value except those in FLAGS.
SUPPORTED: dict[str, str] = {
    "job-name": "J", "gres": "", "gpus": "G", "gpus-per-node": "", "nodes": "N", "ntasks": "n",
    "ntasks-per-node": "", "time": "t", "mem": "", "cpus-per-task": "c", "array": "a", "dependency": "d",
    "output": "o", "error": "e", "signal": "", "account": "A", "partition": "p", "requeue": "",
    "no-requeue": "", "open-mode": "", "chdir": "D", "wckey": "", "comment": "", "export": "", "parsable": "",
}
FLAGS = frozenset({"requeue", "no-requeue", "parsable"})
# Accepted with no effect on Rota (said so in docs/job-authors.md): accounting labels.
NO_EFFECT = frozenset({"wckey", "comment"})
_SHORT = {short: long for long, short in SUPPORTED.items() if short}


class DirectiveError(ValueError):
    """An option sbatch refuses: the message names it and says why."""


@dataclass
class Options:
    values: dict[str, str] = field(default_factory=dict)  # long name -> value ("" for a flag)

    def get(self, name: str, default: str = "") -> str:
        return self.values.get(name, default)

    def has(self, name: str) -> bool:
        return name in self.values


def script_directives(text: str) -> list[str]:
    """The arguments of the `#SBATCH` lines before the script's first command, in order."""
    arguments: list[str] = []
    for number, line in enumerate(text.splitlines()):
        stripped = line.strip()
        if number == 0 and stripped.startswith("#!"):
            continue
        if stripped.startswith("#SBATCH"):
            body = stripped[len("#SBATCH"):]
            arguments.extend(shlex.split(body.split(" #", 1)[0], comments=False))
        elif stripped and not stripped.startswith("#"):
            break  # sbatch stops reading directives at the first command
    return arguments


def parse(arguments: Sequence[str], into: Options | None = None, *, where: str = "") -> tuple[Options, list[str]]:
    """Options from `arguments` (later ones win), and what follows them (the script and its
    arguments on a command line). DirectiveError naming an unsupported or malformed option."""
    options = into if into is not None else Options()
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        if not argument.startswith("-") or argument == "-":
            return options, list(arguments[index:])
        if argument == "--":
            return options, list(arguments[index + 1:])
        name, value, inline = _split(argument, where)
        if name in FLAGS:
            if inline:
                raise DirectiveError(f"{where}--{name}: takes no value (got {value!r})")
            options.values[name] = ""
        else:
            if not inline:
                index += 1
                if index >= len(arguments):
                    raise DirectiveError(f"{where}--{name}: needs a value")
                value = arguments[index]
            options.values[name] = value
        index += 1
    return options, []


def _split(argument: str, where: str) -> tuple[str, str, bool]:
    if argument.startswith("--"):
        name, equals, value = argument[2:].partition("=")
        inline = bool(equals)
    else:
        short = argument[1:2]
        if short not in _SHORT:
            raise DirectiveError(f"{where}{argument}: option -{short} is not supported by Rota's sbatch")
        name, value = _SHORT[short], argument[2:].lstrip("=")
        inline = bool(argument[2:])
    if name not in SUPPORTED:
        raise DirectiveError(f"{where}--{name}: option not supported by Rota's sbatch (see docs/job-authors.md)")
    return name, value, inline
