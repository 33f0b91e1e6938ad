"""The Manta SDK: ``from manta import Client``. The ``manta`` command is :mod:`manta.cli`."""

__version__ = "0.1.0"

from .client import Client
from .errors import ApiError, ConnectionFailed, MantaError

__all__ = ["ApiError", "Client", "ConnectionFailed", "MantaError", "__version__"]
