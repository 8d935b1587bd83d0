"""The names Horovod scripts use exist in hvdlite's modules (docs/horovod-compat.md lists
them with their meaning). One process, no ranks: only the import surface is checked here;
behaviour is tested by the multi-rank tests."""
import importlib

import pytest

from harness.checks import require

BASICS = ["init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
          "cross_size", "cross_rank", "mpi_threads_supported", "mpi_built", "mpi_enabled",
          "gloo_built", "gloo_enabled", "nccl_built", "cuda_built", "rocm_built", "ddl_built",
          "ccl_built", "start_timeline", "stop_timeline", "ProcessSet", "global_process_set",
          "add_process_set", "remove_process_set", "Average", "Sum", "Adasum", "Compression"]

NAMES = {
    "hvdlite.torch": BASICS + [
        "is_homogeneous", "Min", "Max", "Product", "allreduce", "allreduce_", "allreduce_async",
        "allreduce_async_", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
        "grouped_allreduce_async_", "allgather", "allgather_async", "grouped_allgather",
        "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
        "broadcast_async_", "alltoall", "alltoall_async", "reducescatter", "reducescatter_async",
        "grouped_reducescatter", "grouped_reducescatter_async", "sparse_allreduce_async", "join",
        "barrier", "poll", "synchronize", "DistributedOptimizer", "broadcast_parameters",
        "broadcast_optimizer_state", "broadcast_object", "allgather_object", "SyncBatchNorm",
        "HorovodInternalError", "elastic"],
    "hvdlite.torch.mpi_ops": ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter",
                              "synchronize", "poll", "sparse_allreduce_async", "Average", "Sum",
                              "Adasum"],
    "hvdlite.torch.compression": ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"],
    "hvdlite.torch.elastic": ["TorchState", "run"],
    "hvdlite.tensorflow": BASICS + [
        "is_homogeneous", "Min", "Max", "Product", "allreduce", "grouped_allreduce", "allgather",
        "grouped_allgather", "broadcast", "broadcast_", "alltoall", "reducescatter",
        "grouped_reducescatter", "join", "barrier", "broadcast_variables",
        "broadcast_global_variables", "BroadcastGlobalVariablesHook", "broadcast_object",
        "broadcast_object_fn",
        "allgather_object", "DistributedGradientTape", "PartialDistributedGradientTape",
        "DistributedOptimizer", "SyncBatchNormalization", "size_op", "rank_op", "local_rank_op",
        "local_size_op", "process_set_included_op", "elastic", "_executing_eagerly",
        "gpu_available"],
    "hvdlite.tensorflow.util": ["_executing_eagerly"],
    "hvdlite.tensorflow.compression": ["Compression", "Compressor", "NoneCompressor",
                                       "FP16Compressor"],
    "hvdlite.tensorflow.elastic": ["TensorFlowState", "TensorFlowKerasState", "ObjectState",
                                   "run"],
    "hvdlite.tensorflow.keras": BASICS + [
        "DistributedOptimizer", "PartialDistributedOptimizer", "allreduce", "allgather",
        "broadcast", "reducescatter", "broadcast_global_variables", "load_model", "callbacks",
        "elastic"],
    "hvdlite.keras": BASICS + [
        "DistributedOptimizer", "PartialDistributedOptimizer", "allreduce", "allgather",
        "broadcast", "reducescatter", "broadcast_global_variables", "load_model", "callbacks",
        "elastic"],
    "hvdlite.tensorflow.keras.callbacks": [
        "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
        "LearningRateWarmupCallback", "BestModelCheckpoint"],
    "hvdlite.keras.callbacks": [
        "BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
        "LearningRateWarmupCallback", "BestModelCheckpoint"],
    "hvdlite.tensorflow.keras.elastic": ["KerasState", "TensorFlowKerasState", "CommitStateCallback",
                                         "UpdateBatchStateCallback", "UpdateEpochStateCallback",
                                         "run"],
    "hvdlite.common.exceptions": ["HorovodInternalError", "HostsUpdatedInterrupt"],
}


@pytest.mark.parametrize("module", sorted(NAMES))
def test_horovod_names_exist(module):
    if module.startswith("hvdlite.torch"):
        require("torch")
    if module.startswith(("hvdlite.tensorflow", "hvdlite.keras")):
        require("tensorflow")
    mod = importlib.import_module(module)
    missing = [n for n in NAMES[module] if not hasattr(mod, n)]
    assert not missing, f"{module} lacks Horovod's names {missing}"


@pytest.mark.parametrize("module", sorted(NAMES))
def test_signatures_readable_before_init(module):
    """help(hvd.allreduce) before init() shows the signature, whose defaults include
    global_process_set: its repr must not need the engine."""
    if module.startswith("hvdlite.torch"):
        require("torch")
    if module.startswith(("hvdlite.tensorflow", "hvdlite.keras")):
        require("tensorflow")
    import inspect
    import pydoc

    import hvdlite
    assert not hvdlite.is_initialized()
    mod = importlib.import_module(module)
    checked = 0
    for name in NAMES[module]:
        obj = getattr(mod, name)
        if not callable(obj):
            continue
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            continue  # builtins without a signature
        text = str(sig)
        checked += 1
        for param in sig.parameters.values():
            assert param.name in text, f"{module}.{name}{text} lacks {param.name}"
            if isinstance(param.default, hvdlite.ProcessSet):
                assert f"{param.name}={param.default!r}" in text and "ranks=None" in text, \
                    f"{module}.{name}{text}: the process set's default"
        if inspect.isclass(obj) and obj.__init__ is object.__init__ and obj.__new__ is object.__new__:
            continue  # help() shows no signature for a class without one of its own
        assert text in pydoc.render_doc(obj, renderer=pydoc.plaintext), f"help({module}.{name}) lacks {text}"
    assert checked > 0, f"no signature of {module} was checked"
    assert "ranks=None" in repr(hvdlite.global_process_set)
