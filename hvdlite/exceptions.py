"""Exceptions raised by hvdlite. All derive from :class:`HvdliteError`."""


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


# Engine ErrorKind (csrc/common/common.h) -> exception class.
_BY_KIND = {
    1: InvalidArgumentError,
    2: TensorMismatchError,
    3: HvdliteShutdownError,
    4: MPIError,
    5: StallError,
    6: HvdliteError,
    7: NotInitializedError,
    8: HvdliteTimeoutError,
}

# Kinds after which this rank's MPI_Finalize would wait for a lost peer.
PEER_LOST_KINDS = (4, 8)


def from_kind(kind, message):
    return _BY_KIND.get(kind, HvdliteError)(message)
