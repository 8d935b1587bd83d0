"""Small helpers Horovod's TensorFlow module exposes under the same names."""
from tensorflow.python.eager import context


def _executing_eagerly():
    """True when ops run eagerly (TF2 default), False while building a graph
    (tf.function tracing, tf.compat.v1 graphs)."""
    return context.executing_eagerly()
