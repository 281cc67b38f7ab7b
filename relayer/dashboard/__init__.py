"""``relayer dashboard``: the operations web page (needs the ``dashboard`` extra).

Reads the stores' own tables (no worker needed; any number of dashboards at once), one sampler
per store shared by every viewer; changes go through the CLI's service functions with a guard
and an audit row. Read-only unless started with a token. See docs/dashboard.md.
"""

from __future__ import annotations

from relayer.dashboard.app import create_app
from relayer.dashboard.security import Access, Token, loopback_hosts, parse_token

__all__ = ["Access", "Token", "create_app", "loopback_hosts", "parse_token"]
