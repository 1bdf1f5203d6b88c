"""The package version, recorded in checkpoints and results files (pyproject.toml holds the same number)."""

__version__ = "0.1.0"
