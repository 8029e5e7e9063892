"""The package list pyproject.toml cannot compute for a mapped folder: services/ is `roundtrip`, each package below
it `roundtrip.<name>`, and schemas/ is `roundtrip.schemas` (package-dir and package-data are in pyproject.toml)."""

from setuptools import find_packages, setup

setup(packages=["roundtrip", *(f"roundtrip.{name}" for name in find_packages("services")), "roundtrip.schemas"])
