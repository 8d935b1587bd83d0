"""Each collective, described once for every front end.

A collective here is: its arguments' rules, the engine request it becomes
(a dict of :func:`hvdlite._binding.enqueue` arguments), how its result is
read back (engine-allocated outputs, alltoall's received splits) and its
gradient rule. A front end (NumPy, torch's engine and device paths,
TensorFlow) supplies only an :class:`Adapter` for its tensors and calls the
functions below; a new collective is one section here plus a few lines per
adapter.

Gradient rules (Horovod's), written against :class:`GradientOps`, which
each framework implements with its own collectives:

=================  =========================================================
collective         backward
=================  =========================================================
allreduce          allreduce of the gradient with the same op and factors
allgather          allreduce (Average) of the gradient, then this rank's rows
broadcast          allreduce (Average) of the gradient, zero off the root
alltoall           alltoall of the gradient back along the received splits
reducescatter      allgather of the gradient, times the set size for Sum
                   (not divided for Average) and the pre/postscale factors
=================  =========================================================

Nothing here imports torch or TensorFlow.
"""
from . import _binding, request
from ._binding import ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST, JOIN, REDUCESCATTER
from .process_sets import process_set_id
from .request import Average, Sum


class Adapter:
    """What a front end tells the request layer about its tensors."""

    def dtype_code(self, tensor, what):
        """The engine's dtype code of ``tensor`` (raises for others)."""
        raise NotImplementedError

    def address(self, tensor):
        """The address of a contiguous tensor's first element (int or cdata)."""
        raise NotImplementedError

    def wrap(self, owned, nbytes, shape, dtype):
        """A tensor of ``dtype`` over an engine-allocated buffer, without a copy."""
        raise NotImplementedError

    def int_vector(self, values):
        """Alltoall's received splits as the front end's integer vector."""
        raise NotImplementedError


# ---------------------------------------------------------------- results

def engine_output(adapter, dtype):
    """``finish=`` of collectives whose output the engine allocates."""
    def finish(handle_id):
        owned, nbytes, shape = _binding.take_output(handle_id)
        return adapter.wrap(owned, nbytes, shape, dtype)
    return finish


def engine_output_into(adapter, dtype, output, nbytes):
    """``finish=`` of an allgather, reducescatter or alltoall submitted with the
    caller-owned ``output`` of ``nbytes`` (submit's ``output_bytes``): ``output``
    where the engine wrote the result into it (it was exactly that long), else
    the engine-allocated result, as :func:`engine_output`'s."""
    def finish(handle_id):
        owned, got, shape = _binding.take_output(handle_id)
        if owned is None:
            return output
        return adapter.wrap(owned, got, shape, dtype)
    return finish


def submit(req, adapter, src, *, output=None, output_bytes=0, keep=None, finish=None):
    """Enqueues request ``req`` of the contiguous tensor ``src`` (and the
    caller-owned ``output`` of allreduce and broadcast, or of ``output_bytes``
    for the results of allgather, reducescatter and alltoall); the result is
    ``finish(handle)`` or, without it, ``output``."""
    return _binding.enqueue(
        input_ptr=adapter.address(src), output_ptr=0 if output is None else adapter.address(output),
        output_bytes=output_bytes, keep=keep, finish=finish, result=output, **req)


# ---------------------------------------------------------------- allreduce

def allreduce_request(code, shape, name, op, prescale, postscale, spec, process_set, what):
    """An allreduce (the per-gradient path calls ``allreduce_fast``)."""
    return dict(op=ALLREDUCE, name=name, dtype_code=code, shape=shape, reduce_op=op,
                prescale=request.factor(prescale, "prescale_factor", what),
                postscale=request.factor(postscale, "postscale_factor", what),
                compression=spec, process_set=process_set_id(process_set))


# An allreduce into a caller-owned output with arguments already checked,
# in one C call: it runs once per gradient per step. Arguments: name, dtype
# code, shape, input and output addresses, op, prescale, postscale, spec,
# process set id, keep, result[, finish].
allreduce_fast = _binding.enqueue_allreduce


def allreduce_grad(ops, grads, op, prescale, postscale):
    return ops.allreduce(grads, op, prescale, postscale)


# ---------------------------------------------------------------- allgather

def allgather_request(code, shape, name, process_set):
    """A 0-d tensor is gathered as one row (the C API's rule, as Horovod
    gathers scalars into a vector of size())."""
    return dict(op=ALLGATHER, name=name, dtype_code=code, shape=shape,
                process_set=process_set_id(process_set))


def allgather_grad(ops, grads):
    return ops.own_rows(ops.allreduce(grads, Average, 1.0, 1.0))


# ---------------------------------------------------------------- broadcast

def broadcast_request(code, shape, name, root_rank, process_set, what):
    """``root_rank`` is a rank of the job, as in Horovod; the engine takes
    the root's position within the process set."""
    return dict(op=BROADCAST, name=name, dtype_code=code, shape=shape,
                root_rank=request.root_in_set(root_rank, process_set, what),
                process_set=process_set_id(process_set))


def broadcast_grad(ops, grads, is_root):
    reduced = ops.allreduce(grads, Average, 1.0, 1.0)
    # Multiplied by zero, not replaced: the result must depend on the
    # allreduce, or a graph could prune it on some ranks only.
    return reduced if is_root else ops.times(reduced, 0)


# ---------------------------------------------------------------- alltoall

def alltoall_request(code, shape, name, splits, process_set, what):
    """``splits[i]`` rows go to rank i; None: the first dimension divided equally."""
    return dict(op=ALLTOALL, name=name, dtype_code=code, shape=shape,
                splits=request.splits_list(splits, what), process_set=process_set_id(process_set))


def alltoall_result(adapter, dtype, process_set, data=None):
    """``finish=`` of an alltoall: (received rows, rows received from each rank);
    ``data``: the rows' own ``finish=`` (default :func:`engine_output`'s)."""
    data = data or engine_output(adapter, dtype)
    n = request.set_size(process_set)

    def finish(handle_id):
        return data(handle_id), adapter.int_vector(_binding.received_splits(handle_id, n))
    return finish


def alltoall_grad(ops, grad, received_splits):
    return ops.alltoall(grad, received_splits)


# ---------------------------------------------------------------- reducescatter

def reducescatter_request(code, shape, name, op, prescale, postscale, spec, process_set, what):
    """Rows of the result split as evenly as possible, earlier ranks taking
    one more when they do not divide."""
    return dict(op=REDUCESCATTER, name=name, dtype_code=code, shape=shape, reduce_op=op,
                prescale=request.factor(prescale, "prescale_factor", what),
                postscale=request.factor(postscale, "postscale_factor", what),
                compression=spec, process_set=process_set_id(process_set))


def reducescatter_grad_scale(op, prescale, postscale, set_size):
    """The gathered gradient's factor: the set size for Sum (not divided for
    Average, as Horovod does), times the pre/postscale factors."""
    return (set_size if op == Sum else 1) * prescale * postscale


def reducescatter_grad(ops, grads, op, prescale, postscale, set_size):
    scale = reducescatter_grad_scale(op, prescale, postscale, set_size)
    return ops.allgather(grads if scale == 1 else ops.times(grads, scale))


# ---------------------------------------------------------------- control

def barrier_request(process_set):
    return dict(op=BARRIER, dtype_code=0, shape=(), process_set=process_set_id(process_set))


def join_request(process_set):
    """Join's result is the rank that joined last."""
    return dict(op=JOIN, dtype_code=0, shape=(), process_set=process_set_id(process_set))


def join_result(handle_id):
    return int(_binding.lib.hvd_handle_value(handle_id))


def barrier(process_set=None):
    _binding.enqueue(**barrier_request(process_set)).wait()


def join(process_set=None):
    return _binding.enqueue(finish=join_result, **join_request(process_set)).wait()


# ---------------------------------------------------------------- gradients

class GradientOps:
    """A framework's collectives on lists of gradients, for the rules above
    (each method takes and returns a list)."""

    def allreduce(self, grads, op, prescale, postscale):
        raise NotImplementedError

    def allgather(self, grads):
        raise NotImplementedError

    def alltoall(self, grad, splits):
        raise NotImplementedError

    def own_rows(self, reduced):
        """This rank's rows of each allgather's reduced gradient."""
        raise NotImplementedError

    def times(self, grads, factor):
        raise NotImplementedError
