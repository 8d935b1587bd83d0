"""Which Keras an object belongs to, and the few operations that differ
between them.

Two Keras run on TensorFlow 2.16+: Keras 3 (the ``keras`` package) and
Keras 2 (the ``tf_keras`` package; ``tf.keras`` is tf_keras when
``TF_USE_LEGACY_KERAS=1``). A script may also import ``tf_keras`` directly
while ``import keras`` gives Keras 3, so hvdlite asks each model, optimizer
or callback which Keras its class comes from instead of assuming one.
"""
import json
import os
import sys
import zipfile

import numpy as np
import tensorflow as tf

KERAS3 = "Keras 3"
KERAS2 = "Keras 2 (tf_keras)"


def _root_flavor(module_name):
    root = module_name.partition(".")[0]
    if root == "tf_keras":
        return KERAS2
    if root == "keras":
        keras = sys.modules.get("keras")
        version = getattr(keras, "__version__", "3")
        return KERAS3 if not version.startswith("2.") else KERAS2
    return None


def of(obj):
    """KERAS3, KERAS2 or None for an object (or class) that is not a Keras one."""
    cls = obj if isinstance(obj, type) else type(obj)
    for c in cls.__mro__:
        found = _root_flavor(getattr(c, "__module__", "") or "")
        if found is not None:
            return found
    return None


def tf_keras_requested():
    """True when TensorFlow routes ``tf.keras`` to tf_keras (its own rule)."""
    return os.environ.get("TF_USE_LEGACY_KERAS", None) in ("true", "True", "1")


def default():
    """The Keras ``tf.keras`` stands for in this process."""
    return KERAS2 if tf_keras_requested() else KERAS3


def module(flavor=None):
    """The Keras package of ``flavor`` (default: the one ``tf.keras`` is)."""
    flavor = flavor or default()
    if flavor == KERAS2:
        import tf_keras
        return tf_keras
    import keras
    if keras.backend.backend() != "tensorflow":
        raise ImportError(
            f"hvdlite.tensorflow.keras needs Keras' TensorFlow backend, but Keras runs on "
            f"{keras.backend.backend()!r}; set KERAS_BACKEND=tensorflow before importing keras")
    return keras


def of_saved_model(filepath):
    """The Keras that saved ``filepath``: the version a ``.keras`` archive or an
    HDF5 file records; a SavedModel directory is tf_keras' (Keras 3 loads
    those only as an inference layer). Unknown: the one ``tf.keras`` is."""
    path = os.fspath(filepath) if isinstance(filepath, (str, os.PathLike)) else None
    if path is not None and os.path.isdir(path):
        return KERAS2
    version = ""
    try:
        if path is not None and zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                if "metadata.json" in archive.namelist():
                    version = json.loads(archive.read("metadata.json")).get("keras_version", "")
        else:
            import h5py
            h5 = h5py.File(path, "r") if path is not None else filepath
            try:
                version = h5.attrs.get("keras_version", "")
            finally:
                if path is not None:
                    h5.close()
    except (OSError, ValueError, ImportError, AttributeError):
        pass
    if isinstance(version, bytes):
        version = version.decode("utf-8", "replace")
    if not version:
        return default()
    return KERAS2 if str(version).startswith("2.") else KERAS3


def graph_session():
    """The Keras session of a TF1 graph (tf_keras with eager execution
    disabled): where Keras runs its variables' ops."""
    return tf.compat.v1.keras.backend.get_session()


# ------------------------------------------------------------------ optimizers

def is_legacy_optimizer(optimizer):
    """tf_keras.optimizers.legacy.* (OptimizerV2), not the newer tf_keras optimizers."""
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is None:
        return False
    return isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer)


def is_optimizer(optimizer):
    """True for a Keras 3, tf_keras or tf_keras legacy optimizer."""
    flavor = of(optimizer)
    if flavor == KERAS3:
        return isinstance(optimizer, sys.modules["keras"].optimizers.Optimizer)
    if flavor == KERAS2 and "tf_keras" in sys.modules:
        tf_keras = sys.modules["tf_keras"]
        return isinstance(optimizer, (tf_keras.optimizers.Optimizer,
                                      tf_keras.optimizers.legacy.Optimizer))
    return False


def optimizer_variables(optimizer):
    """The optimizer's variables as a list (a property in Keras 3 and tf_keras,
    a method in the legacy optimizers)."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def build_optimizer(optimizer, variables):
    """Creates the optimizer's slot variables for ``variables`` now (they are
    otherwise made on the first step), so they can be broadcast or saved."""
    variables = list(variables)
    if not variables:
        return
    with tf.init_scope():
        if is_legacy_optimizer(optimizer):
            optimizer._create_all_weights(variables)   # idempotent
        elif of(optimizer) == KERAS3:
            if not optimizer.built:
                import keras
                with keras.name_scope(optimizer.name, caller=optimizer):
                    optimizer.build(variables)
                optimizer.built = True
        else:
            optimizer.build(variables)                 # idempotent


def is_variable(value):
    """A tf.Variable or a Keras 3 Variable (not a Python number)."""
    if isinstance(value, tf.Variable):
        return True
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(value, getattr(keras, "Variable", ()))


def get_value(value):
    """A float from a variable, tensor or number."""
    return float(np.asarray(value.numpy() if hasattr(value, "numpy") else value))
