"""The clmf version (its own module, so that library modules need not import ``clmf``)."""
__version__ = "0.1.0"
