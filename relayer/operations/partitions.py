"""``relayer partitions rotate STORE``: one rotation of a partitioned store's partitions, run
by an operator or a cron job through the store's ``admin_dsn`` (else its ``dsn``), as the
worker leading the store's cleanup runs it every ``cleanup_interval`` (docs/storage.md#rotation).

It lets a deployment whose workers' role does not own the tables (and so may not create or
drop partitions) rotate from a job that connects as the owner.
"""

from __future__ import annotations

from dataclasses import dataclass

from relayer.errors import ConfigurationError
from relayer.operations.schema import require_schema
from relayer.settings import StoreSettings
from relayer.store.driver import connect, translated
from relayer.store.maintenance import PartitionHealth, read_partition_health
from relayer.store.partitions import Rotation, check_storage, rotate, storage_of


@dataclass(frozen=True, slots=True)
class RotationReport:
    """What one rotation did, and the store's partitions after it."""

    store: str
    rotation: Rotation
    partitions: PartitionHealth


async def rotate_partitions(store: StoreSettings) -> RotationReport:
    """Check the store (configured and created partitioned, its schema applied), rotate once
    and read its partitions. ConfigurationError for a delete-mode store or one whose outbox
    has the other mode, SchemaNotAppliedError before `schema apply`, StoreError for database
    trouble; a rotation that stopped early says why in ``rotation.skipped``."""
    if store.storage != "partitioned":
        raise ConfigurationError(
            f"stores.{store.name}.storage",
            store.storage,
            "only a partitioned store (storage = 'partitioned') has partitions to rotate",
        )
    async with await connect(store, purpose="partitions", dsn=store.admin_dsn) as conn:
        # Autocommit: no transaction of this connection keeps the rotation's detach waiting.
        with translated(store, "read the store's tables"):
            await require_schema(conn, store)
            check_storage(store, await storage_of(conn, store))
        rotation = await rotate(store)
        with translated(store, "read the partitions"):
            partitions = await read_partition_health(conn, store)
    return RotationReport(store.name, rotation, partitions)
