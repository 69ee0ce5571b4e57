"""The head's requests, one module per family (as pueue's ``message_handler/``): ``OPS`` maps
each request's ``op`` to its handler, which checks its own fields beside what it does. The
server looks a request up here, never by an attribute's name: an op is answered only when
a family lists it, and no two families may list one (``tests/unit/test_head_ops.py``)."""

from __future__ import annotations

from . import accounting, cluster, jobs
from .base import Handler, Served

FAMILIES = (jobs, accounting, cluster)
OPS: dict[str, Handler] = {name: handler for family in FAMILIES for name, handler in family.OPS.items()}

__all__ = ["FAMILIES", "OPS", "Handler", "Served"]
