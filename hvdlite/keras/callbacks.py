"""``hvdlite.keras.callbacks``: the callbacks of :mod:`hvdlite.tensorflow.keras.callbacks`."""
from ..tensorflow.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint, BroadcastGlobalVariablesCallback, Callback, DiLoCoCallback,
    LearningRateScheduleCallback, LearningRateWarmupCallback, LocalSGDCallback,
    MetricAverageCallback, prepare_model_for_training)
