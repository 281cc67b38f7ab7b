"""Django settings: the database is the relayer store's ($RELAYER_CONFIG or relayer.toml here)."""

from __future__ import annotations

import os
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from relayer import load_settings

HERE = Path(__file__).resolve().parent
# The store the order service writes its events to; Django uses the same database, so an
# order and its outbox row share one transaction.
RELAYER = load_settings(os.environ.get("RELAYER_CONFIG") or HERE / "relayer.toml").store("orders")
_database = conninfo_to_dict(RELAYER.require_dsn())

SECRET_KEY = "example-only"  # an example's throw-away key
DEBUG = True
INSTALLED_APPS = ["orders"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _database.get("dbname", "postgres"),
        "USER": _database.get("user", ""),
        "PASSWORD": _database.get("password", ""),
        "HOST": _database.get("host", ""),
        "PORT": _database.get("port", ""),
    }
}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "urls"
