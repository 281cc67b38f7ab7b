"""How a ``relayer run`` process shares its slots and connections among its stores
(``[worker]``): the pool of slots, the dispatch policy and weights, the connection budget."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from relayer.settings.values import Count, Duration


class WorkerSettings(BaseModel):
    """How a ``relayer run`` process schedules lane scans across its stores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool_size: Count = Field(default=20, ge=1, le=10_000)
    policy: Literal["strict", "weighted"] = "weighted"
    weights: dict[str, Count] = Field(default_factory=dict)
    # Connections the process may hold open to PostgreSQL, all its stores together
    # (relayer.store.databases); unset: what its databases and pool_size need, logged at start.
    max_connections: Count | None = Field(default=None, ge=1, le=100_000)
    # A batch connection unused this long is closed (an idle database holds none).
    batch_max_idle: Duration = timedelta(seconds=60)

    @field_validator("batch_max_idle")
    @classmethod
    def _check_max_idle(cls, value: timedelta) -> timedelta:
        if not timedelta(0) < value <= timedelta(days=1):
            raise ValueError("must be greater than 0 and at most 1 day")
        return value

    @field_validator("weights")
    @classmethod
    def _check_weights(cls, value: dict[str, int]) -> dict[str, int]:
        for store, weight in value.items():
            if weight < 1:
                raise ValueError(f"the weight of store {store!r} is {weight}; weights are >= 1")
        return value
