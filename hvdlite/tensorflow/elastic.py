"""Elastic state objects for TensorFlow (Horovod's ``hvd.elastic``).

- ``TensorFlowState(variables, session=None, **attrs)``: a list of
  variables plus Python attributes;
- ``TensorFlowKerasState(model, optimizer=None, backend=None, **attrs)``: a
  Keras model (Keras 3 or tf_keras) and its optimizer, plus attributes;
- ``ObjectState(**attrs)``: Python attributes only;
- ``run(func)``: see :mod:`hvdlite.elastic`.

``commit()`` keeps a copy of the values in host memory, ``restore()`` writes
it back, ``sync()`` broadcasts rank 0's variables and attributes. They work
eagerly and, given a session, in TF1 graphs. Under elastic hvdrun a commit
also goes to the host's memory, for the job to resume from when it starts
again on other hosts (:mod:`hvdlite.elastic`, docs/elastic.md).
"""
import tensorflow as tf

from .. import basics, exceptions
from ..elastic import HostsUpdatedInterrupt, ObjectState as _ObjectState, run
from . import functions, keras_flavor


def _broadcast_object(obj):
    return functions.broadcast_object(obj, root_rank=0, name="elastic.state")


class ObjectState(_ObjectState):
    """Python attributes kept in sync across ranks (``ObjectState(epoch=0)``)."""

    def __init__(self, bcast_object=_broadcast_object, get_rank=basics.rank, **kwargs):
        super().__init__(bcast_object, get_rank, **kwargs)


class VariableSnapshot:
    """Host-memory copies of a list of variables (tf.Variable or Keras
    Variable), read and written eagerly or through a TF1 session.
    ``variables`` is a function returning the current list: an optimizer
    creates its slots later, and the list grows then."""

    def __init__(self, variables, session=None, name="elastic"):
        self._variables = variables
        self.session = session
        self.name = name
        self._values = []
        self._graph_broadcasts = {}

    def save(self):
        variables = self._variables()
        if self.session is not None:
            self._values = list(self.session.run(variables)) if variables else []
        else:
            self._values = [v.numpy() for v in variables]

    def restore(self):
        # An optimizer built after the last commit has more variables than
        # were saved; its first ones (the saved ones) come back.
        for v, value in zip(self._variables(), self._values):
            if tuple(v.shape) != tuple(value.shape):
                raise exceptions.InvalidArgumentError(
                    f"elastic state restore: variable {getattr(v, 'name', '?')} has shape "
                    f"{tuple(v.shape)}, its commit {tuple(value.shape)}; the model or optimizer "
                    "changed since the commit")
            if self.session is not None:
                v.load(value, self.session)
            else:
                v.assign(value)

    def broadcast(self):
        """Every rank's variables become rank 0's."""
        variables = self._variables()
        if not variables:
            return
        if self.session is None:
            functions.broadcast_variables(variables, 0, name=f"{self.name}.sync")
            return
        key = tuple(id(v) for v in variables)
        op = self._graph_broadcasts.get(key)
        if op is None:
            with self.session.graph.as_default():
                op = functions.broadcast_variables(variables, 0, name=f"{self.name}.sync")
            self._graph_broadcasts[key] = op
        self.session.run(op)


def _graph_session(session, keras_graph=False):
    """The session of a TF1 graph (None when running eagerly); Keras' own
    session for a Keras model."""
    if tf.executing_eagerly():
        return None
    if session is None and keras_graph:
        session = tf.compat.v1.keras.backend.get_session()
    if session is None:
        session = tf.compat.v1.get_default_session()
    if session is None:
        raise exceptions.InvalidArgumentError(
            "elastic state in a TF1 graph needs a session: pass session=, or create the state "
            "inside `with tf.compat.v1.Session() as sess:`")
    return session


class TensorFlowState(_ObjectState):
    """State of a list of variables and Python attributes.

    ``variables`` default to ``tf.compat.v1.global_variables()`` in a TF1
    graph (eagerly there is no such collection: pass them). ``session``
    (TF1 graphs) defaults to the default session."""

    def __init__(self, variables=None, session=None, **kwargs):
        if variables is None:
            if tf.executing_eagerly():
                raise exceptions.InvalidArgumentError(
                    "TensorFlowState needs variables=[...] when running eagerly (TF2 has no "
                    "global variable collection)")
            variables = tf.compat.v1.global_variables()
        self.variables = list(variables)
        self.session = _graph_session(session)
        self._snapshot = VariableSnapshot(lambda: self.variables, self.session,
                                          name="TensorFlowState")
        self._snapshot.save()
        super().__init__(bcast_object=_broadcast_object, get_rank=basics.rank, **kwargs)

    def save(self):
        self._snapshot.save()
        super().save()

    def restore(self):
        self._snapshot.restore()
        super().restore()

    def sync(self):
        self._snapshot.broadcast()
        self._snapshot.save()
        super().sync()

    def _commit_payload(self):
        return dict(super()._commit_payload(), variables=self._snapshot._values)

    def _load_commit_payload(self, payload):
        super()._load_commit_payload(payload)
        self._snapshot._values = list(payload["variables"])


class TensorFlowKerasState(_ObjectState):
    """State of a Keras model (Keras 3 or tf_keras), its optimizer and Python
    attributes. The model must be built. ``optimizer`` defaults to the one
    the model was compiled with; ``sync()`` builds it first (creating its
    slots), so every rank broadcasts the same variables. In a TF1 graph the
    values go through Keras' session. ``backend`` is accepted for Horovod
    compatibility."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        if not hasattr(model, "variables") or not hasattr(model, "built"):
            raise exceptions.InvalidArgumentError(
                "TensorFlowKerasState takes a Keras model (Keras 3 or tf_keras), not "
                f"{type(model).__module__}.{type(model).__name__}")
        if not model.built:
            raise exceptions.InvalidArgumentError(
                "TensorFlowKerasState: the model must be built first; run model.build(input_shape) "
                "or call it on data")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self.backend = backend
        session = _graph_session(None, keras_graph=True)
        self._model_snapshot = VariableSnapshot(lambda: list(self.model.variables), session,
                                                name="TensorFlowKerasState.model")
        self._optimizer_snapshot = VariableSnapshot(self._optimizer_variables, session,
                                                    name="TensorFlowKerasState.optimizer")
        self._save_model()
        super().__init__(bcast_object=_broadcast_object, get_rank=basics.rank, **kwargs)

    def _optimizer_variables(self):
        if self.optimizer is None:
            return []
        return keras_flavor.optimizer_variables(self.optimizer)

    def _save_model(self):
        self._model_snapshot.save()
        self._optimizer_snapshot.save()

    def save(self):
        self._save_model()
        super().save()

    def restore(self):
        self._model_snapshot.restore()
        self._optimizer_snapshot.restore()
        super().restore()

    def _build_optimizer(self):
        # A fresh optimizer has no slots yet: build it so that every rank
        # has the same variables to broadcast or restore.
        if self.optimizer is not None and tf.executing_eagerly():
            keras_flavor.build_optimizer(self.optimizer, self.model.trainable_variables)

    def _commit_payload(self):
        return dict(super()._commit_payload(), model=self._model_snapshot._values,
                    optimizer=self._optimizer_snapshot._values)

    def _load_commit_payload(self, payload):
        super()._load_commit_payload(payload)
        self._build_optimizer()
        self._model_snapshot._values = list(payload["model"])
        self._optimizer_snapshot._values = list(payload["optimizer"])

    def sync(self):
        self._build_optimizer()
        self._model_snapshot.broadcast()
        self._optimizer_snapshot.broadcast()
        self._save_model()
        super().sync()


__all__ = ["TensorFlowState", "TensorFlowKerasState", "ObjectState", "HostsUpdatedInterrupt",
           "run"]
