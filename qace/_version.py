"""The package's version: a leaf that every module reads it from (the signature, the exporter, the
reports, the command line) and that the build reads too (``pyproject.toml``'s dynamic version), so the
number lives in one place and nothing inside the package imports the root package."""

__version__ = "0.1.0"
