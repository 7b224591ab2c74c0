"""The integrity checks of a results folder, as analysis and `harness check` read them.

Their owner is harness.store (the folder format: names, statuses, which points are corrupt and
why); this module names what a reader of results needs from it.
"""

from harness.store import (
    CORRUPT,
    FINISHED,
    POINT_FILES,
    STATUSES,
    CorruptPoint,
    check_sweep,
    point_dirs,
    point_problems,
    read_status,
    sweep_folders,
)

__all__ = [
    "CORRUPT",
    "FINISHED",
    "POINT_FILES",
    "STATUSES",
    "CorruptPoint",
    "check_sweep",
    "point_dirs",
    "point_problems",
    "read_status",
    "sweep_folders",
]
