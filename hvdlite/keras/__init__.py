"""``import hvdlite.keras as hvd``: the same API as :mod:`hvdlite.tensorflow.keras`
(Keras 3 runs on TensorFlow here), for scripts written for ``horovod.keras``."""
from ..tensorflow.keras import *  # noqa: F401,F403
from ..tensorflow.keras import __all__, callbacks, load_model  # noqa: F401
