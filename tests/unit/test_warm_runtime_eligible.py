"""Which launches the agent's warm runtime takes (rota.agent.warm_runtime.eligible): only
what its own interpreter would run as `-m MODULE` or `SCRIPT.py`, with the environment an
interpreter reads at start unchanged; everything else starts cold."""

from __future__ import annotations

import sys

from rota.agent.warm_runtime import eligible

WARM_ENV = {"PYTHONPATH": "/a:/b", "PATH": "/usr/bin"}


def test_a_module_or_a_script_of_the_same_interpreter_goes_warm() -> None:
    assert eligible([sys.executable, "-m", "train", "--lr", "1"], WARM_ENV, WARM_ENV)
    assert eligible([sys.executable, "/jobs/train.py"], {**WARM_ENV, "PATH": "/elsewhere", "X": "1"}, WARM_ENV)


def test_other_commands_and_start_time_environment_go_cold() -> None:
    assert not eligible(["/usr/bin/env", "python", "train.py"], WARM_ENV, WARM_ENV)
    assert not eligible([sys.executable, "-c", "print(1)"], WARM_ENV, WARM_ENV)
    assert not eligible([sys.executable, "-m"], WARM_ENV, WARM_ENV)
    assert not eligible([sys.executable], WARM_ENV, WARM_ENV)
    assert not eligible([sys.executable, "-u", "train.py"], WARM_ENV, WARM_ENV)
    assert not eligible([sys.executable, "train.py"], {**WARM_ENV, "PYTHONPATH": "/c"}, WARM_ENV)
    assert not eligible([sys.executable, "train.py"], {**WARM_ENV, "LD_PRELOAD": "/lib/x.so"}, WARM_ENV)
