"""Malformed configuration through the command line: environment variables and TOML files.

Each case is refused at start-up, before any connection (every case's DSN points at a closed
port, so reaching the database would exit 1 instead), with exit status 2 and exactly one line
naming the field, the value and the rule. The planted DSN password and SASL password never
show.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.badinput.support import (
    SASL_SECRET,
    SECRET,
    UNREACHABLE_DSN,
    CliCase,
    error_line,
    run_cases,
)

STORE = "RELAYER_STORES__ORDERS__"
PRINT = ("schema", "print", "orders")
RUN = ("run", "orders")
TOML_STORE = '[stores.orders]\ntable_prefix = "orders_"\ndefault_transport = "events"\n'
TOML_KAFKA = (
    TOML_STORE + '[stores.orders.transports.events]\ntype = "kafka"\n'
    f'"bootstrap.servers" = "127.0.0.1:1"\n"sasl.password" = "{SASL_SECRET}"\n'
)
TOML_RABBITMQ = TOML_STORE + '[stores.orders.transports.events]\ntype = "rabbitmq"\n'
ERROR = "relayer: error: "

# (case, the whole line it must print; {config} is the case's TOML file)
CASES: list[tuple[CliCase, str]] = [
    (
        CliCase("lanes-zero", PRINT, {STORE + "LANES": "0"}),
        "stores.orders.lanes: '0' is invalid: must be an integer from 1 to 65,536",
    ),
    (
        CliCase("lanes-not-a-number", PRINT, {STORE + "LANES": "many"}),
        "stores.orders.lanes: 'many' is invalid: Input should be a valid integer, unable to "
        "parse string as an integer",
    ),
    (
        CliCase("batch-size-too-big", PRINT, {STORE + "BATCH_SIZE": "10001"}),
        "stores.orders.batch_size: '10001' is invalid: must be an integer from 1 to 10,000",
    ),
    (
        CliCase("lease-too-long", PRINT, {STORE + "LEASE_DURATION": "2h"}),
        "stores.orders.lease_duration: '2h' is invalid: must be from 1 second to 1 hour",
    ),
    (
        CliCase("lease-not-a-duration", PRINT, {STORE + "LEASE_DURATION": "soon"}),
        "stores.orders.lease_duration: 'soon' is invalid: must be a duration: seconds as a "
        "number, a number with a unit ('250ms', '30s', '5m', '1h', '7d') or ISO 8601 ('PT30S')",
    ),
    (
        CliCase("poll-above-a-third-of-the-lease", PRINT, {STORE + "POLL_INTERVAL": "20s"}),
        "stores.orders.poll_interval: '20s' is invalid: must be less than lease_duration / 3 "
        "(10 s for lease_duration 30 s)",
    ),
    (
        CliCase("backoff-max-below-backoff", PRINT, {STORE + "RETRY_BACKOFF_MAX": "500ms"}),
        "stores.orders.retry_backoff_max: '0.5s' is invalid: must be at least retry_backoff (1 s)",
    ),
    (
        CliCase("max-body-zero", PRINT, {STORE + "MAX_BODY_BYTES": "0"}),
        "stores.orders.max_body_bytes: '0' is invalid: must be an integer from 1 to 1,073,741,824",
    ),
    (
        CliCase("parked-retention-too-short", PRINT, {STORE + "PARKED_RETENTION": "30s"}),
        "stores.orders.parked_retention: '30s' is invalid: must be at least 1 hour (it deletes "
        "data an operator may still need), or 'off' (the default)",
    ),
    (
        CliCase("inbox-retention-zero", PRINT, {STORE + "INBOX_RETENTION": "0s"}),
        "stores.orders.inbox_retention: '0s' is invalid: must be greater than 0, or 'off' to "
        "keep inbox entries forever",
    ),
    (
        CliCase("grace-too-long", PRINT, {STORE + "UNORDERED_GRACE": "2d"}),
        "stores.orders.unordered_grace: '2d' is invalid: must be from 0 seconds to 1 day",
    ),
    (
        CliCase("notify-not-a-mode", PRINT, {STORE + "NOTIFY": "maybe"}),
        "stores.orders.notify: 'maybe' is invalid: must be 'after_commit' (the workers are "
        "woken right after the application's commit, by a connection of relayer's own: the "
        "default), 'in_transaction' (a NOTIFY in the application's transaction, which "
        "serializes its commits) or 'off' (the workers find rows by polling)",
    ),
    (
        CliCase("storage-not-a-mode", PRINT, {STORE + "STORAGE": "truncate"}),
        "stores.orders.storage: 'truncate' is invalid: must be 'delete' (each sent row is "
        "deleted: the default) or 'partitioned' (rows are appended into range partitions, each "
        "lane's progress advances, passed partitions are dropped; docs/storage.md)",
    ),
    (
        CliCase("partition-span-too-short", PRINT, {STORE + "PARTITION_SPAN": "30s"}),
        "stores.orders.partition_span: '30s' is invalid: must be from 1 minute to 1 day",
    ),
    (
        CliCase("default-transport-not-configured", PRINT, {STORE + "DEFAULT_TRANSPORT": "kafka"}),
        "stores.orders.default_transport: 'kafka' is invalid: must name one of this store's "
        "transports (none)",
    ),
    (
        CliCase("misspelt-setting", PRINT, {STORE + "LANEZ": "3"}),
        "stores.orders.lanez: 3 is invalid: is not a setting relayer knows (did you mean "
        "'lanes'?); fix its name or remove it",
    ),
    (
        CliCase("pool-size-zero", PRINT, {"RELAYER_WORKER__POOL_SIZE": "0"}),
        "worker.pool_size: '0' is invalid: Input should be greater than or equal to 1",
    ),
    (
        CliCase("max-connections-zero", RUN, {"RELAYER_WORKER__MAX_CONNECTIONS": "0"}),
        "worker.max_connections: '0' is invalid: Input should be greater than or equal to 1",
    ),
    (
        CliCase(
            "max-connections-below-the-fixed-ones", RUN, {"RELAYER_WORKER__MAX_CONNECTIONS": "3"}
        ),
        "worker.max_connections: 3 is invalid: must be at least 4 for these stores: their 1 "
        "database(s) hold 3 connections of their own (housekeeping, LISTEN and dispatcher, per "
        "database; no LISTEN behind a transaction pooler without listen_dsn) plus at least one "
        "batch connection each; raise it, or serve fewer databases per process",
    ),
    (
        CliCase("batch-max-idle-zero", RUN, {"RELAYER_WORKER__BATCH_MAX_IDLE": "0s"}),
        "worker.batch_max_idle: '0s' is invalid: must be greater than 0 and at most 1 day",
    ),
    (
        CliCase("unknown-policy", PRINT, {"RELAYER_WORKER__POLICY": "random"}),
        "worker.policy: 'random' is invalid: Input should be 'strict' or 'weighted'",
    ),
    (
        CliCase("unknown-log-level", PRINT, {"RELAYER_LOG_LEVEL": "LOUD"}),
        "log_level: 'LOUD' is invalid: Input should be 'DEBUG', 'INFO', 'WARNING' or 'ERROR'",
    ),
    (
        CliCase("worker-section-as-text", PRINT, {"RELAYER_WORKER": "abc"}),
        "RELAYER_WORKER: 'abc' is invalid: sets a whole section, so it must be a JSON object; "
        "set one value per variable instead, e.g. RELAYER_WORKER__POOL_SIZE=20",
    ),
    (
        CliCase("stores-section-as-text", PRINT, {"RELAYER_STORES": "orders"}),
        "RELAYER_STORES: '***' is invalid: sets a whole section, so it must be a JSON object; "
        "set one value per variable instead, e.g. RELAYER_STORES__<STORE>__DSN=...",
    ),
    (
        CliCase("weights-as-pairs", PRINT, {"RELAYER_WORKER__WEIGHTS": "orders=3"}),
        "RELAYER_WORKER__WEIGHTS: 'orders=3' is invalid: sets a whole section, so it must be a "
        "JSON object; set one value per variable instead, e.g. RELAYER_WORKER__WEIGHTS__ORDERS=3",
    ),
    (
        CliCase("transports-section-as-text", PRINT, {STORE + "TRANSPORTS": "kafka"}),
        "RELAYER_STORES__ORDERS__TRANSPORTS: '***' is invalid: sets a whole section, so it must "
        "be a JSON object; set one value per variable instead, e.g. "
        "RELAYER_STORES__ORDERS__TRANSPORTS__<TRANSPORT>__TYPE=...",
    ),
    (
        CliCase("value-as-a-section", PRINT, {"RELAYER_LOG_LEVEL__DEBUG": "1"}),
        "RELAYER_LOG_LEVEL__DEBUG: '1' is invalid: RELAYER_LOG_LEVEL is a single value, not a "
        "section; set RELAYER_LOG_LEVEL itself",
    ),
    (
        CliCase("misspelt-top-level-lanes", PRINT, {"RELAYER_LANES": "8"}),
        "RELAYER_LANES: '8' is invalid: is not a setting relayer knows; did you mean "
        "RELAYER_STORES__<STORE>__LANES (a setting of the [stores] section)?",
    ),
    (
        CliCase("misspelt-dsn", PRINT, {"RELAYER_DNS": UNREACHABLE_DSN}),
        "RELAYER_DNS: '***' is invalid: is not a setting relayer knows; did you mean RELAYER_DSN?",
    ),
    (
        CliCase("single-underscores", PRINT, {"RELAYER_STORES_ORDERS_LANES": "0"}),
        "RELAYER_STORES_ORDERS_LANES: '0' is invalid: is not a setting relayer knows; did you "
        "mean RELAYER_STORES__ORDERS__LANES?",
    ),
    (
        CliCase("misspelt-log-level", PRINT, {"RELAYER_LOG_LEVL": "DEBUG"}),
        "RELAYER_LOG_LEVL: 'DEBUG' is invalid: is not a setting relayer knows; did you mean "
        "RELAYER_LOG_LEVEL?",
    ),
    (
        CliCase("misspelt-section", PRINT, {"RELAYER_WORKERS__POOL_SIZE": "0"}),
        "RELAYER_WORKERS__POOL_SIZE: '0' is invalid: is not a setting relayer knows; did you "
        "mean RELAYER_WORKER__POOL_SIZE?",
    ),
    (
        CliCase("unknown-variable", PRINT, {"RELAYER_COLOUR": "blue"}),
        "RELAYER_COLOUR: 'blue' is invalid: is not a setting relayer knows (settings: "
        "RELAYER_DSN, RELAYER_STORES__..., RELAYER_TEMPLATES__..., RELAYER_WORKER__..., "
        "RELAYER_LOG_LEVEL, "
        "RELAYER_LOG_FORMAT, RELAYER_CONFIG and the options of `relayer run`, such as "
        "RELAYER_METRICS_PORT); fix its name or unset it",
    ),
    (
        CliCase("run-option-misspelt", RUN, {"RELAYER_METRICS_PROT": "9464"}),
        "RELAYER_METRICS_PROT: '9464' is invalid: is not a setting relayer knows; did you mean "
        "RELAYER_METRICS_PORT?",
    ),
    (
        CliCase("run-option-port", RUN, {"RELAYER_METRICS_PORT": "http"}),
        "RELAYER_METRICS_PORT: 'http' is not a TCP port (0-65535) (it stands for "
        "--metrics-port); fix it or unset it",
    ),
    (
        CliCase("run-option-interval", RUN, {"RELAYER_METRICS_INTERVAL": "0s"}),
        "RELAYER_METRICS_INTERVAL: '0s' is not a duration > 0 (it stands for "
        "--metrics-interval); fix it or unset it",
    ),
    (
        CliCase("run-option-top-lanes", RUN, {"RELAYER_METRICS_TOP_LANES": "-1"}),
        "RELAYER_METRICS_TOP_LANES: '-1' is not a whole number from 0 to 1000 (it stands for "
        "--metrics-top-lanes); fix it or unset it",
    ),
    (
        CliCase("run-option-processes", RUN, {"RELAYER_PROCESSES": "many"}),
        "RELAYER_PROCESSES: 'many' is not a process count (1-1024 or auto) (it stands for "
        "--processes); fix it or unset it",
    ),
    (
        CliCase("toml-lanes-true", PRINT, toml=TOML_STORE + "lanes = true\n"),
        "stores.orders.lanes: True is invalid: must be a whole number, not true or false",
    ),
    (
        CliCase(
            "toml-weight-true", PRINT, toml="[stores.orders]\n[worker.weights]\norders = true\n"
        ),
        "worker.weights.orders: True is invalid: must be a whole number, not true or false",
    ),
    (
        CliCase("toml-weight-of-unknown-store", PRINT, toml="[worker.weights]\nordres = 3\n"),
        "worker.weights.ordres: 3 is invalid: names no configured store (configured stores: "
        "'orders'); did you mean 'orders'?",
    ),
    (
        CliCase("dsn-does-not-parse", PRINT, {STORE + "DSN": "not a dsn at all ==="}),
        "stores.orders.dsn: '***' is invalid: is not a PostgreSQL connection string (missing "
        '"=" after "..." in connection info string); use a postgresql:// URL (percent-encode '
        "spaces as %20) or key=value pairs, putting a value that contains spaces in single "
        "quotes",
    ),
    (
        CliCase(
            "dsn-password-with-a-space", PRINT, {STORE + "DSN": f"password={SECRET} 2{SECRET}"}
        ),
        "stores.orders.dsn: '***' is invalid: is not a PostgreSQL connection string (missing "
        '"=" after "..." in connection info string); use a postgresql:// URL (percent-encode '
        "spaces as %20) or key=value pairs, putting a value that contains spaces in single "
        "quotes",
    ),
    (
        CliCase(
            "top-level-dsn-does-not-parse", PRINT, {"RELAYER_DSN": f"postgresql://u:{SECRET} x@h/d"}
        ),
        "dsn: '***' is invalid: is not a PostgreSQL connection string (unexpected spaces found "
        'in "...", use percent-encoded spaces (%20) instead); use a postgresql:// URL '
        "(percent-encode spaces as %20) or key=value pairs, putting a value that contains "
        "spaces in single quotes",
    ),
    *(
        (
            CliCase(f"system-schema-{schema}", PRINT, {STORE + "SCHEMA": schema}),
            f"stores.orders.schema: '{schema}' is invalid: is a PostgreSQL system schema (pg_* "
            "and information_schema are reserved, and pg_dump leaves them out); use a schema of "
            "your own, such as 'relayer' or 'public'",
        )
        for schema in ("information_schema", "pg_catalog", "pg_toast", "pg_relayer")
    ),
    (
        CliCase(
            "rabbitmq-http-url",
            RUN,
            toml=TOML_RABBITMQ + f'url = "http://u:{SASL_SECRET}@127.0.0.1:1/"\n',
        ),
        "stores.orders.transports.events.url: 'http://u:***@127.0.0.1:1/' is invalid: must "
        "start with amqp:// or amqps://",
    ),
    (
        CliCase(
            "batch-max-idle-true", RUN, toml="[stores.orders]\n[worker]\nbatch_max_idle = true\n"
        ),
        "worker.batch_max_idle: True is invalid: must be a duration: seconds as a number, a "
        "number with a unit ('250ms', '30s', '5m', '1h', '7d') or ISO 8601 ('PT30S'), not true "
        "or false",
    ),
    (
        CliCase(
            "toml-weight-of-a-template",
            RUN,
            toml="[stores.orders]\n[worker.weights]\ntenants = 2\n[templates.tenants]\n"
            'discovery.file = "tenants.json"\n',
        ),
        "worker.weights.tenants: 2 is invalid: names template 'tenants', not a store; weigh "
        'all its stores with templates.tenants.weight, or one of them as "tenants.NAME"',
    ),
    (
        CliCase(
            "toml-not-utf-8", PRINT, toml='[stores.orders]\nschema = "caf\xe9"\n'.encode("latin-1")
        ),
        "config: '{config}' is invalid: is not UTF-8 text (byte 0xe9 at offset 29 cannot be "
        "decoded); TOML files are UTF-8: save it as UTF-8",
    ),
    (
        CliCase("toml-misspelt-section", PRINT, toml='[store.orders]\ndsn = "x"\nlanes = 3\n'),
        "store: {{orders}} is invalid: is not a setting relayer knows (did you mean 'stores'?); "
        "fix its name or remove it",
    ),
    (
        CliCase("store-not-configured", ("schema", "print", "billing")),
        "store: 'billing' is invalid: is not configured (configured stores: 'orders'); add a "
        "[stores.billing] section to the config file or set RELAYER_STORES__BILLING__DSN",
    ),
    (
        CliCase("store-named-twice", ("run", "orders", "orders")),
        "stores: 'orders' is invalid: is named twice; store names are case-sensitive and unique "
        "in a process",
    ),
    (
        CliCase("toml-syntax", PRINT, toml="[stores.orders\nlanes = 3\n"),
        "config: '{config}' is invalid: is not valid TOML: Expected ']' at the end of a table "
        "declaration (at line 1, column 15)",
    ),
    (
        CliCase("toml-store-name", PRINT, toml='[stores."bad name"]\nlanes = 3\n'),
        "stores.bad name.name: 'bad name' is invalid: a store name is 1-63 characters: letters, "
        "digits, '_', '.' or '-', starting with a letter or digit (names are case-sensitive)",
    ),
    (
        CliCase("toml-stores-share-tables", PRINT, toml="[stores.a]\n[stores.b]\n"),
        "stores.b: 'public.relayer_*' is invalid: uses the same database, schema and table "
        "prefix as store 'a'; distinct stores must not share tables",
    ),
    (
        CliCase("toml-dsn-not-text", PRINT, toml="[stores.orders]\ndsn = 5\n"),
        "stores.orders.dsn: '***' is invalid: Input should be a valid string",
    ),
    (
        CliCase(
            "unknown-transport-type", RUN, toml=TOML_RABBITMQ.replace("rabbitmq", "carrier-pigeon")
        ),
        "stores.orders.transports.events.type: 'carrier-pigeon' is invalid: is not a known "
        "transport type "
        "(known: {known}); fix the type or install the package that registers it in the "
        "entry-point group 'relayer.transports'",
    ),
    (
        CliCase("kafka-acks-1", RUN, toml=TOML_KAFKA + 'acks = "1"\n'),
        "stores.orders.transports.events.acks: '1' is invalid: must be all: per-key order after "
        "a failure depends on it (remove the setting to get the safe value)",
    ),
    (
        CliCase("kafka-transactional", RUN, toml=TOML_KAFKA + '"transactional.id" = "t"\n'),
        "stores.orders.transports.events.transactional.id: 't' is invalid: relayer uses an "
        "idempotent, non-transactional producer; remove it",
    ),
    (
        CliCase("kafka-timeout-short", RUN, toml=TOML_KAFKA + '"message.timeout.ms" = 1000\n'),
        "stores.orders.transports.events.message.timeout.ms: 1000 is invalid: must be greater "
        "than the relay's batch deadline (15000 ms, half the store's lease_duration): the "
        "gapless guarantee does not cover this timeout, so a shorter one lets a key's later "
        "message overtake an earlier one; use at least 30000 or shorten lease_duration",
    ),
    (
        CliCase(
            "kafka-no-bootstrap",
            RUN,
            toml=TOML_KAFKA.replace('"bootstrap.servers" = "127.0.0.1:1"\n', ""),
        ),
        "stores.orders.transports.events.bootstrap.servers: None is invalid: is required: the "
        "brokers to connect to, e.g. 'kafka1:9092,kafka2:9092'",
    ),
    (
        CliCase("rabbitmq-no-url", RUN, toml=TOML_RABBITMQ),
        "stores.orders.transports.events.url: None is invalid: is required: "
        "amqp://user:***@host:5672/vhost (or amqps://)",
    ),
    (
        CliCase(
            "rabbitmq-unknown-option",
            RUN,
            toml=TOML_RABBITMQ + f'url = "amqp://u:{SASL_SECRET}@127.0.0.1:1/"\nprefetch = 3\n',
        ),
        "stores.orders.transports.events.prefetch: 3 is invalid: is not an option of the "
        "rabbitmq transport (known options: url, ordered_destinations, max_outstanding, "
        "connect_timeout, close_timeout, reconnect_interval)",
    ),
    (
        CliCase("pooler-session", PRINT, {STORE + "POOLER": "session"}),
        "stores.orders.pooler: 'session' is invalid: must be 'none' (a direct connection, or a "
        "pooler in session mode) or 'transaction' (PgBouncer, PgCat or Supavisor pooling by "
        "transaction)",
    ),
    (
        CliCase(
            "options-behind-a-transaction-pooler",
            RUN,
            {
                STORE + "POOLER": "transaction",
                STORE + "DSN": UNREACHABLE_DSN + "&options=-c%20statement_timeout%3D5s",
            },
        ),
        "stores.orders.dsn: '***' is invalid: sets options, which a pooler in transaction mode "
        "refuses at connect (pooler = 'transaction'); set them on the role (ALTER ROLE ... SET) "
        "or remove them",
    ),
    (
        CliCase(
            "listen-dsn-through-the-transaction-pool",
            RUN,
            {STORE + "POOLER": "transaction", STORE + "LISTEN_DSN": UNREACHABLE_DSN},
        ),
        "stores.orders.listen_dsn: '***' is invalid: reaches the same pool as dsn, which pools "
        "by transaction (pooler = 'transaction'), where LISTEN never fires; point it at the "
        "database directly or at a session-mode pool, or leave it out to poll",
    ),
    (
        CliCase("queue-limit-zero", ("queue", "limit", "orders", "0")),
        "limit: 0 is invalid: must be an integer from 1 to 2,147,483,647, or 'none' to remove "
        "the limit",
    ),
    (
        CliCase("drop-every-key-unconfirmed", ("parked", "drop", "orders")),
        "parked drop orders without --key drops every parked key's rows for good; pass --key "
        "KEY for one key, or --yes to drop them all",
    ),
]


@pytest.fixture(scope="module")
def results(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[str, subprocess.CompletedProcess[str]]]:
    directory = tmp_path_factory.mktemp("configuration")
    base = {"RELAYER_DSN": UNREACHABLE_DSN, STORE + "TABLE_PREFIX": "orders_"}
    return directory, run_cases([case for case, _ in CASES], directory, base)


@pytest.mark.parametrize(("case", "expected"), CASES, ids=[case.name for case, _ in CASES])
def test_refused_at_start_up_with_one_line(
    case: CliCase,
    expected: str,
    results: tuple[Path, dict[str, subprocess.CompletedProcess[str]]],
) -> None:
    from relayer.transports.registry import known_types

    directory, outcomes = results
    line = error_line(outcomes[case.name])
    config = directory / f"{case.name}.toml"
    assert line == ERROR + expected.format(config=config, known=", ".join(known_types()))
