"""Names that Horovod scripts import from ``horovod.common``."""
