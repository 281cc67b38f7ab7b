"""Django: outbox rows in the transaction of ``django.db.transaction.atomic()``.

Django 4.2 and later talk to PostgreSQL through psycopg 3. Inside an ``atomic`` block, the
psycopg connection under Django's connection is in that block's transaction (a savepoint in a
nested block), so ``Outbox.write`` and ``write_many`` given Django's connection write their rows
there: they commit with the block, roll back with it (or with a nested block's savepoint), and
the workers' NOTIFY is delivered only on commit, as PostgreSQL holds notifications until then::

    from django.db import connection, transaction

    with transaction.atomic():
        order = Order.objects.create(customer=customer, amount=amount)
        outbox.write(connection, destination="orders.events", key=customer, body=event)

``connection`` may be ``django.db.connection``, ``django.db.connections[alias]`` or, for
another database alias, :func:`psycopg_connection`'s result. Outside ``atomic`` Django runs in
autocommit mode and the row would commit alone: that is refused (UsageError). Django's
connections are synchronous; from an async view call the writing function through asgiref's
``sync_to_async``. Django is imported only when one of its objects is passed (extra ``django``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from relayer.store.caller import connection_of

if TYPE_CHECKING:
    import psycopg

__all__ = ["connection_of", "psycopg_connection"]


def psycopg_connection(using: str = "default") -> psycopg.Connection[Any]:
    """The psycopg connection of Django's database ``using``, inside its atomic block."""
    from django.db import connections

    return connection_of(connections[using])
