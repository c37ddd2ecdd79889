"""The SDK's version, the one value both ``strop.__version__`` and the package's metadata
(``sdk/pyproject.toml`` reads it) carry. It follows the API's version (the OpenAPI schema's
``info.version``, ``SPECTACULAR_SETTINGS["VERSION"]``): tests/sdk/test_packaging.py checks it."""

__version__ = "0.1.0"
