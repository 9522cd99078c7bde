"""Errors of the learning half a user can act on: one line, what is wrong and what to do."""

from __future__ import annotations

from powerctl.errors import PowerctlError


class DataError(PowerctlError):
    """A dataset spec, file or split is unknown, missing, corrupt or unusable as asked."""


class ModelError(PowerctlError):
    """A model name or a model option is unknown or inconsistent."""
