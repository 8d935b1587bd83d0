"""The base class of hvdlite's Keras callbacks, for Keras 3 and Keras 2
(tf_keras) models alike.

It is a subclass of the Callback of the Keras that ``tf.keras`` stands for
(tf_keras with ``TF_USE_LEGACY_KERAS=1``, Keras 3 otherwise) and also
answers what the other Keras asks of its callbacks, so it serves a model of
either.
"""
from .. import keras_flavor as flavor

_KerasCallback = flavor.module().callbacks.Callback


def _overridden(callback, *names):
    return any(not getattr(getattr(callback, n), "_is_default", False) for n in names)


class Callback(_KerasCallback):
    """Base of hvdlite's callbacks (see module doc)."""

    _supports_tf_logs = False  # tf_keras: hand us NumPy logs

    # tf_keras' CallbackList asks every callback which batch hooks it has.
    def _implements_train_batch_hooks(self):
        return _overridden(self, "on_batch_begin", "on_batch_end", "on_train_batch_begin",
                           "on_train_batch_end")

    def _implements_test_batch_hooks(self):
        return _overridden(self, "on_test_batch_begin", "on_test_batch_end")

    def _implements_predict_batch_hooks(self):
        return _overridden(self, "on_predict_batch_begin", "on_predict_batch_end")
