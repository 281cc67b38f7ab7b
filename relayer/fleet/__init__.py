"""relayer.fleet: many stores from one template, found by a discovery source.

- ``templates``: ``[templates.NAME]`` settings, discovery rows and their validation;
- ``sources``: reading a discovery file or a catalog query;
- ``discovery``: the refresh loop that adds and removes a worker's stores (``Fleet``).

Only ``templates`` is imported here: the settings need it, and it needs nothing of the worker.
The settings import ``templates`` halfway through their own module (a template holds every
store setting), so they are imported first here, whichever module a program asks for first.
"""

import relayer.settings  # noqa: F401  (see above)
from relayer.fleet.templates import (
    DiscoveredRow,
    DiscoveredStore,
    DiscoverySettings,
    TemplateSettings,
    store_from_row,
)

__all__ = [
    "DiscoveredRow",
    "DiscoveredStore",
    "DiscoverySettings",
    "TemplateSettings",
    "store_from_row",
]
