"""``relayer dashboard [STORE ...] [--template NAME[,NAME...]]``: the operations web page until
SIGTERM/SIGINT. With ``--template`` its Fleet page lists every store the templates' sources
list too, and a template store's pages open on demand (relayer.dashboard.app)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from pathlib import Path
from typing import Any

from relayer.cli.common import EXIT_OK, Context, environment_option, tcp_port, template_names
from relayer.errors import ConfigurationError, RelayerError, UsageError, install_command

logger = logging.getLogger(__name__)
TOKEN_VARIABLE = "RELAYER_DASHBOARD_TOKEN"
TEMPLATE_VARIABLE = "RELAYER_DASHBOARD_TEMPLATE"


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "dashboard",
        help="serve the operations web page (read-only unless given a token)",
    )
    parser.add_argument(
        "stores", nargs="*", metavar="STORE", help="stores to show (optional with --template)"
    )
    environment_option(
        parser,
        "--template",
        variable=TEMPLATE_VARIABLE,
        parse=template_names,
        default=(),
        metavar="NAME[,NAME...]",
        help="also list every store these templates' discovery sources list on the Fleet "
        "page; their pages open on demand (docs/dashboard.md#fleet)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine)"
    )
    parser.add_argument("--port", type=tcp_port, default=8080, help="TCP port (default: 8080)")
    parser.add_argument(
        "--token",
        help=f"the token that allows changes ('NAME:SECRET' names the actor); prefer "
        f"${TOKEN_VARIABLE} or --token-file, since a command line is visible to other users",
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="a file with one token per line ('NAME:SECRET' lines name the actors)",
    )
    parser.add_argument("--read-only", action="store_true", help="no changes, even with a token")
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="another Host the page may be opened by (a machine name, when binding 0.0.0.0)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often each store is sampled (default: 2; 1-60)",
    )
    parser.set_defaults(handler=_dashboard)


def tokens_from(arguments: argparse.Namespace) -> list[Any]:
    """Every configured token: --token-file lines, $RELAYER_DASHBOARD_TOKEN and --token."""
    from relayer.dashboard.security import parse_token

    tokens = []
    if arguments.token_file:
        path = Path(arguments.token_file)
        try:
            lines = path.read_text("utf-8").splitlines()
        except OSError as exc:
            raise ConfigurationError(
                "--token-file", str(path), f"cannot be read: {exc.strerror}"
            ) from None
        for number, line in enumerate(lines, 1):
            if line.strip() and not line.lstrip().startswith("#"):
                tokens.append(parse_token(f"--token-file line {number}", line))
        if not tokens:
            raise ConfigurationError("--token-file", str(path), "holds no token")
    if os.environ.get(TOKEN_VARIABLE):
        tokens.append(parse_token(TOKEN_VARIABLE, os.environ[TOKEN_VARIABLE]))
    if arguments.token:
        tokens.append(parse_token("--token", arguments.token))
    return tokens


async def _dashboard(context: Context) -> int:
    arguments = context.arguments
    try:
        import uvicorn

        from relayer.dashboard import Access, create_app, loopback_hosts
    except ImportError as exc:
        raise UsageError(
            f"the dashboard needs the 'dashboard' extra ({exc.name} is missing): "
            f"{install_command('dashboard')}"
        ) from None
    if not 1 <= arguments.interval <= 60:
        raise ConfigurationError("--interval", arguments.interval, "must be from 1 to 60 seconds")
    if not arguments.stores and not arguments.template:
        raise UsageError(
            f"dashboard: which stores? give STORE names, or --template NAME ({TEMPLATE_VARIABLE}) "
            "to list the stores a template's discovery source lists"
        )
    stores = [context.store(name) for name in dict.fromkeys(arguments.stores)]
    for store in stores:
        store.require_dsn()
    templates = [context.settings.template(name) for name in dict.fromkeys(arguments.template)]
    tokens = tokens_from(arguments)
    sock = _listen(arguments.host, arguments.port)
    port = sock.getsockname()[1]
    hosts = loopback_hosts(arguments.host, port) | {
        name if ":" in name else f"{name}:{port}" for name in arguments.allow_host
    }
    access = Access(tokens, read_only=arguments.read_only, allowed_hosts=hosts)
    app = create_app(stores, access, templates=templates, interval=arguments.interval)
    mode = "read-only" if access.read_only else f"changes allowed for {len(tokens)} token(s)"
    shown = f"[{arguments.host}]" if ":" in arguments.host else arguments.host
    served = [store.name for store in stores] + [
        f"the stores of template {template.name}" for template in templates
    ]
    logger.info(
        "dashboard for %s on http://%s:%d/ (%s)",
        ", ".join(served),
        shown,
        port,
        mode,
        extra={"action": "dashboard_start"},
    )
    if arguments.host not in ("127.0.0.1", "localhost", "::1") and access.read_only is False:
        logger.warning(
            "the dashboard accepts changes and listens on %s: anyone who can reach it and has "
            "the token can redrive, drop and pause; put it behind TLS or bind 127.0.0.1",
            arguments.host,
            extra={"action": "dashboard_exposed"},
        )
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", proxy_headers=False
    )
    server = uvicorn.Server(config)
    await server.serve(sockets=[sock])
    return EXIT_OK


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RelayerError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock
