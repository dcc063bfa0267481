"""Maps the client distribution's packages of the one `rota` namespace to their folders.

Most live here (clients/rota/...); the wire's generated modules (protos/rota/v1), the pure
core (core/rota/core) and the job kit (jobkit/rota/jobkit) keep their own source roots
beside this folder and are mapped from there. pip builds a wheel (or an editable install)
in place from this folder, so the mapped folders need no copy; an sdist of this folder alone
would not hold them (none is published). pyproject.toml holds everything else.
"""

from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
# (source root relative to this folder, the top packages under its rota/ taken from it)
ROOTS = (
    (".", ("client", "cli", "runtime", "jobfiles", "imageformat", "slurm")),
    ("../protos", ("v1",)),
    ("../core", ("core",)),
    ("../jobkit", ("jobkit",)),
)


def _packages() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for root, tops in ROOTS:
        for top in tops:
            base = HERE / root / "rota" / top
            for init in sorted(base.rglob("__init__.py")):
                name = ".".join(("rota", *init.parent.relative_to(base.parent).parts))
                packages.append(name)
                package_dir[name] = f"{root}/rota/{init.parent.relative_to(base.parent).as_posix()}"
    return packages, package_dir


PACKAGES, PACKAGE_DIR = _packages()
setup(packages=PACKAGES, package_dir=PACKAGE_DIR)
