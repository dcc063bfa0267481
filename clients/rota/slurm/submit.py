"""`sbatch`: a Slurm batch script submitted as a Rota job (or array)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from rota.client import Client, job_spec_from_mapping
from rota.client.jobfile import array_of
from rota.slurm import directives, ids, spool, translate


def read_script(rest: Sequence[str]) -> tuple[str, str]:
    """(the script's name, its text): the file named first after the options, else standard input."""
    if len(rest) > 1:
        raise directives.DirectiveError(f"sbatch: arguments after the script ({' '.join(rest[1:])}) are not supported")
    if not rest:
        return "sbatch", sys.stdin.read()
    path = Path(rest[0])
    if not path.is_file():
        raise directives.DirectiveError(f"sbatch: {rest[0]}: no such file")
    return rest[0], path.read_text()


def options_for(argv: Sequence[str]) -> tuple[directives.Options, str, str]:
    """The script's #SBATCH options overridden by the command line's; the script's name and text."""
    command_line, rest = directives.parse(list(argv))
    script, text = read_script(rest)
    if not text.startswith("#!"):
        raise directives.DirectiveError(f"sbatch: {script}: a batch script starts with #! (such as #!/bin/bash)")
    options, _ = directives.parse(directives.script_directives(text), where=f"{script}: #SBATCH ")
    options.values.update(command_line.values)
    return options, script, text


def sbatch(argv: Sequence[str]) -> int:
    options, script, text = options_for(argv)
    base = spool.root()
    base.mkdir(parents=True, exist_ok=True)
    mapping = translate.job_file(options, text, script, base)
    indices = array_of(mapping)
    spec = job_spec_from_mapping({k: v for k, v in mapping.items() if k != "array"})
    with Client.from_env() as client:
        if indices is not None:
            rota_id = client.submit_array(spec=spec, indices=indices).id
        else:
            rota_id = client.submit(spec=spec).id
    number = ids.slurm_id(rota_id)
    print(number if options.has("parsable") else f"Submitted batch job {number}")
    return 0
