"""Maps the server distribution's part of the one `rota` namespace over its source roots (services, bench).

The client distribution (clients/pyproject.toml, `rota-client`) holds the packages under
clients/, protos/, core/ and jobkit/; this one depends on it.

setuptools' `packages.find` cannot merge one namespace from several roots, so each
sub-package is mapped to its own folder here; pyproject.toml holds everything else.
"""

from pathlib import Path

from setuptools import setup

ROOTS = ("services", "bench")


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
