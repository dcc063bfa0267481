"""Maps the one `rota` import namespace over the source roots (protos, core, services, clients, jobkit, bench).

setuptools' `packages.find` cannot merge one namespace from several roots, so each
sub-package is mapped to its own folder here; pyproject.toml holds everything else.
"""

from pathlib import Path

from setuptools import setup

ROOTS = ("protos", "core", "services", "clients", "jobkit", "bench")


def _packages() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for root in ROOTS:
        base = Path(root) / "rota"
        for init in sorted(base.rglob("*.py")):
            folder = init.parent
            name = ".".join(folder.relative_to(root).parts)
            if name not in package_dir and name != "rota":
                packages.append(name)
                package_dir[name] = str(folder)
    return packages, package_dir


PACKAGES, PACKAGE_DIR = _packages()
setup(packages=PACKAGES, package_dir=PACKAGE_DIR)
