"""Decision sidecar for an unmodified llama.cpp llama-server."""

__all__ = ["__version__"]

__version__ = "0.1.0"
