"""The exceptions Horovod scripts catch by their Horovod names
(``from horovod.common.exceptions import HorovodInternalError,
HostsUpdatedInterrupt``), as hvdlite's classes."""
from ..elastic import HostsUpdatedInterrupt
from ..exceptions import HvdliteError as HorovodInternalError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]
