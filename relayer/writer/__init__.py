"""The writer side: what runs in the application's own process and transaction.

- ``outbox``: ``Outbox``, rows inserted in the caller's transaction;
- ``messages``: ``OutboxMessage`` and the checks that make a message a row;
- ``after_commit``: unordered rows sent right after the application's commit;
- ``ids``: UUIDv7 message ids; ``sequences``: per-key sequence numbers.

The statements are the gateway's (relayer.store.outbox), on the psycopg connection behind what
the application passes (relayer.store.caller). The public names are re-exported by ``relayer``
itself.
"""
