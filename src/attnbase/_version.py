"""The package version (a bottom module: every stage may import it; pyproject.toml reads it)."""

__version__ = "0.1.0"
