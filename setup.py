"""Packaging that pyproject.toml cannot say on its own: web_template/ and recipes/ stay top-level
folders of the repository but install as the package-data packages pipeline.web_template and
pipeline.recipes (read with importlib.resources), so a wheel renders loaders and lists recipes.
Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

DATA_PACKAGES = {"pipeline.web_template": "web_template", "pipeline.recipes": "recipes"}

setup(
    packages=[
        *find_namespace_packages(include=["pipeline", "pipeline.*"], exclude=["*.__pycache__"]),
        *DATA_PACKAGES,
        "pipeline.web_template.loader",
    ],
    package_dir=DATA_PACKAGES,
)
