"""rmq's web dashboard (``rmq dashboard``): see :mod:`rmq.dashboard.app`."""
from rmq.dashboard.app import DEFAULT_DASHBOARD_PORT, create_app, serve

__all__ = ["DEFAULT_DASHBOARD_PORT", "create_app", "serve"]
