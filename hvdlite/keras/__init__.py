"""``import hvdlite.keras as hvd``: the same API as :mod:`hvdlite.tensorflow.keras`
(Keras 3 and tf_keras, both on TensorFlow), for scripts written for ``horovod.keras``."""
from ..tensorflow.keras import *  # noqa: F401,F403
from ..tensorflow.keras import __all__, callbacks, elastic, load_model  # noqa: F401
