"""``relayer dev``: a throw-away PostgreSQL and Kafka-protocol broker for trying relayer.

Both come from the ``embedded`` extra (:mod:`relayer.embedded`, as ``relayer demo`` and the
tests use them): no Docker and no server of one's own. By default they listen where
docker/compose.yaml's do (PostgreSQL on 127.0.0.1:5432 with database ``relayer``, Kafka on
127.0.0.1:9092), so the README's and the examples' settings work unchanged. The command prints
the addresses and a relayer.toml for them, then waits; Ctrl-C or SIGTERM stops both servers and
deletes their data.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
from pathlib import Path
from typing import Any

from relayer.cli.common import EXIT_OK, Context, tcp_port
from relayer.errors import ConfigurationError, RelayerError

POSTGRES_PORT = 5432  # docker/compose.yaml's
KAFKA_PORT = 9092
DATABASE = "relayer"


class PortInUseError(RelayerError):
    """A port ``relayer dev`` was asked to listen on is taken."""


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "dev",
        help="run a throw-away PostgreSQL and Kafka-protocol broker for trying relayer "
        "(no Docker; Ctrl-C stops them and deletes their data)",
    )
    parser.add_argument(
        "--pg-port",
        type=tcp_port,
        default=POSTGRES_PORT,
        metavar="PORT",
        help=f"PostgreSQL's port on 127.0.0.1 (default {POSTGRES_PORT}; 0: any free port)",
    )
    parser.add_argument(
        "--kafka-port",
        type=tcp_port,
        default=KAFKA_PORT,
        metavar="PORT",
        help=f"the Kafka-protocol broker's port on 127.0.0.1 (default {KAFKA_PORT}; 0: any free)",
    )
    parser.add_argument(
        "--database",
        action="append",
        metavar="NAME",
        help=f"a database to create (repeatable; default {DATABASE!r}); "
        "the printed relayer.toml uses the first",
    )
    parser.add_argument(
        "--write-config", metavar="FILE", help="also write the relayer.toml to FILE (a new file)"
    )
    parser.set_defaults(handler=_dev)


def relayer_toml(dsn: str, bootstrap: str) -> str:
    """A store ``orders`` on the servers (the README's store), relaying to their Kafka."""
    return (
        "[stores.orders]\n"
        f"dsn = {json.dumps(dsn)}\n"
        'schema = "messaging"\n'
        'table_prefix = "orders_"\n'
        'default_transport = "kafka"\n'
        "\n"
        "[stores.orders.transports.kafka]\n"
        'type = "kafka"\n'
        f'"bootstrap.servers" = {json.dumps(bootstrap)}\n'
    )


def _refuse_taken(port: int, flag: str, what: str) -> None:
    """One line naming the port and the flag, before anything starts, when ``port`` is taken."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            raise PortInUseError(
                f"127.0.0.1:{port} is in use (a {what} of your own?); use that one, stop it, "
                f"or give {flag} PORT (0: any free port)"
            ) from None


def _check_arguments(arguments: argparse.Namespace) -> tuple[list[str], Path | None]:
    from relayer.identifiers import check_plain_identifier

    databases = [check_plain_identifier("--database", name) for name in arguments.database or []]
    target = Path(arguments.write_config) if arguments.write_config else None
    if target is not None and target.exists():
        raise ConfigurationError(
            "--write-config", str(target), "must name a new file (remove it or choose another)"
        )
    _refuse_taken(arguments.pg_port, "--pg-port", "PostgreSQL")
    _refuse_taken(arguments.kafka_port, "--kafka-port", "Kafka")
    return databases or [DATABASE], target


async def _dev(context: Context) -> int:
    from relayer.embedded import EmbeddedKafka, EmbeddedPostgres  # the extra: on use only

    arguments = context.arguments
    databases, target = _check_arguments(arguments)
    if arguments.log_level is None:  # the servers' start-up lines would repeat what is printed
        logging.getLogger("relayer").setLevel(logging.WARNING)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    say("relayer dev: starting a throw-away PostgreSQL and Kafka-protocol broker ...")
    with contextlib.ExitStack() as services:
        postgres = services.enter_context(EmbeddedPostgres(durable=False, port=arguments.pg_port))
        for name in databases:
            postgres.create_database(name)
        kafka = services.enter_context(EmbeddedKafka(arguments.kafka_port))
        dsn = f"postgresql://postgres@127.0.0.1:{postgres.port}/{databases[0]}"
        config = relayer_toml(dsn, kafka.bootstrap_servers)
        if target is not None:
            target.write_text(config)
        _announce(postgres.port, databases, kafka.bootstrap_servers, config, target)
        await stop.wait()
        say("relayer dev: stopping (their data is deleted) ...")
    say("relayer dev: stopped")
    return EXIT_OK


def _announce(
    pg_port: int, databases: list[str], bootstrap: str, config: str, target: Path | None
) -> None:
    say(
        f"  PostgreSQL  127.0.0.1:{pg_port}, user postgres (any password), "
        f"databases {', '.join(databases)}"
    )
    say(f"              postgresql://postgres@127.0.0.1:{pg_port}/{databases[0]}")
    say(f"  Kafka       {bootstrap} (Kafka protocol, in memory: create topics before use)")
    written = f" (written to {target})" if target is not None else ""
    say(f"\nrelayer.toml for store 'orders' on them{written}:\n\n{config}")
    say("ready: Ctrl-C (or SIGTERM) stops both and deletes their data")


def say(line: str) -> None:
    print(line, flush=True)  # read line by line by whoever started it (a terminal or a test)
