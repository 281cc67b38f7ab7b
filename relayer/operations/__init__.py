"""Operations: what an operator reads and changes about a store, from the CLI or the dashboard.

- ``status``: a store's cluster, lanes, parked keys and health, read in one go;
- ``parked``: list, redrive and drop parked keys;
- ``queues``: pause, resume or limit a store's dispatch queues, and a limit as typed;
- ``schema``: numbered migrations, apply and drift checks;
- ``grants``: the least privileges of each role;
- ``health``: the outbox table's health (dead tuples, vacuum, sizes, partitions ahead);
- ``partitions``: one rotation of a partitioned store's partitions, run by an operator.
"""
