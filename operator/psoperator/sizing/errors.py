"""What the sizing functions raise."""

from __future__ import annotations


class SizingError(ValueError):
    """Model hints or inputs the planner cannot work with."""


class DoesNotFit(SizingError):
    """No number of PS of the given memory can hold the model."""
