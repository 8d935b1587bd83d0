"""``hvdlite.keras.elastic``: :mod:`hvdlite.tensorflow.keras.elastic`."""
from ..tensorflow.keras.elastic import *  # noqa: F401,F403
from ..tensorflow.keras.elastic import __all__  # noqa: F401
