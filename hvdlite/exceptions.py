"""Exceptions raised by hvdlite. All derive from :class:`HvdliteError`.

Which engine error kind raises which class is the binding's table
(:data:`hvdlite._binding._ERROR_CLASSES`)."""


class HvdliteError(RuntimeError):
    """Base class of every error hvdlite raises."""

    # TensorFlow's autograph would rewrap it in a generic StagingError.
    ag_pass_through = True


class InvalidArgumentError(HvdliteError, ValueError):
    """The call was wrong on this rank (bad shape, root rank, splits, ...)."""


class UnsupportedDTypeError(InvalidArgumentError, TypeError):
    """The array's dtype cannot be used with this collective."""


class NotInitializedError(InvalidArgumentError):
    """hvdlite.init() has not been called (or shutdown() has)."""


class TensorMismatchError(HvdliteError):
    """Ranks submitted the same tensor name with different metadata."""


class HvdliteShutdownError(HvdliteError):
    """The engine stopped: shutdown() was called, or another rank left."""


class HvdliteTimeoutError(HvdliteShutdownError):
    """A peer rank stopped answering (dead or hung) and the engine gave up
    waiting: after HVDLITE_TIMEOUT_SECONDS, or at shutdown."""


class MPIError(HvdliteError):
    """An MPI call inside the engine failed."""


class StallError(HvdliteError):
    """The stall inspector gave up on a tensor some ranks never submitted."""
