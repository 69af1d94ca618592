"""devkit's version, in a module of its own so that any module can import it
without importing the package's __init__ (which imports nearly everything)."""

__version__ = "0.1.0"
