"""relayer.fleet: many stores from one template, found by a discovery source.

- ``templates``: discovery rows and their validation as stores of a template;
- ``sources``: reading a discovery file or a catalog query;
- ``discovery``: the refresh loop that adds and removes a worker's stores (``Fleet``).

A template's own settings (``TemplateSettings``, ``DiscoverySettings``) live in
relayer.settings, which imports nothing of this package; they are re-exported here. Only
``templates`` is imported here: it needs nothing of the worker.
"""

from relayer.fleet.templates import DiscoveredRow, DiscoveredStore, store_from_row
from relayer.settings.templates import DiscoverySettings, TemplateSettings

__all__ = [
    "DiscoveredRow",
    "DiscoveredStore",
    "DiscoverySettings",
    "TemplateSettings",
    "store_from_row",
]
