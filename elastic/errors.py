"""The root of this project's exceptions."""

from __future__ import annotations


class ElasticError(Exception):
    """The base every exception this project raises derives from: users catch it.

    Subclasses keep a built-in base (`RuntimeError`, `ValueError`) where callers already catch
    that one, e.g. a training step's `except RuntimeError` around a collective.
    """
