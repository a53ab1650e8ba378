"""Writing a snapshot: the writer, partitioned jobs, engines, and progress.

The writer (:mod:`~snapstore.write.writer`) turns samples into shards, index, manifest and commit
record; a large stage is split into partitions written by separate workers and committed
together (:mod:`~snapstore.write.partitions`, :mod:`~snapstore.write.parallel`), on threads,
processes, Dask or Ray (:mod:`~snapstore.write.engines`), with a progress display
(:mod:`~snapstore.write.progress`). A stage's settings are a
:class:`~snapstore.write.stageoptions.StageOptions`; one job's materialization of a stage call
(claiming, waiting for another job, passing through, partitioned jobs) is
:mod:`~snapstore.write.jobs`.

Layer: above :mod:`snapstore.read`; imports it and the layers below (an engine backed by an
integration, such as Ray, is named by a "module:attribute" string and imported on first use).
"""

from .engines import Engine, make_engine
from .partitions import PartitionStatus, partition_status
from .stageoptions import StageOptions
from .writer import Columns, SnapshotWriter, WriteOptions

__all__ = [
    "Columns",
    "Engine",
    "PartitionStatus",
    "SnapshotWriter",
    "StageOptions",
    "WriteOptions",
    "make_engine",
    "partition_status",
]
