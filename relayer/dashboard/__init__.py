"""``relayer dashboard``: the operations web page (needs the ``dashboard`` extra).

Reads the stores' own tables through the store gateway (no worker needed; any number of
dashboards at once), one sampler per store shared by every viewer; changes go through the
service functions the CLI uses too (relayer.operations) with a guard and an audit row.
Read-only unless started with a token. See docs/dashboard.md.

Modules: ``app`` (the ASGI application), ``routes`` (paths and their guard), ``site`` (what
every page shares: stores, templates, live fragments, the event stream), ``pages``,
``parked_pages`` and ``sessions`` (the handlers), ``params`` (checked request parameters),
``stores`` and ``sampler`` (one pool and one sampler per open store), ``actions`` (changes and
bulk runs), ``views`` (a lane's detail with why it is not moving, the queues and the
health, each put together from several reads), ``lanes`` (the heat map's encoding),
``security`` and ``format``.
"""

from __future__ import annotations

from relayer.dashboard.app import create_app
from relayer.dashboard.security import Access, Token, loopback_hosts, parse_token

__all__ = ["Access", "Token", "create_app", "loopback_hosts", "parse_token"]
