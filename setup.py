"""Maps the top-level folders onto the ``deltabench`` namespace (``harness/`` -> ``deltabench.harness``).

There is no ``deltabench/`` folder; the layout is the architecture (see DESIGN in the README).
Everything else about the package lives in pyproject.toml.
"""

from setuptools import find_namespace_packages, setup

LAYERS = ["references", "kernels", "harness", "runners", "db", "web"]
found = find_namespace_packages(include=[f"{layer}*" for layer in LAYERS])
packages = [f"deltabench.{name}" for name in found if "__pycache__" not in name]
package_dir = {f"deltabench.{layer}": layer for layer in LAYERS}

setup(packages=packages, package_dir=package_dir)
