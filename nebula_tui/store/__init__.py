"""The store: the only package that speaks SQL. SQLite in WAL mode through sqlite-utils,
written by the head service alone (``nebula serve``), one transaction per state change.

Its parts, lowest first (each imports only parts before it):

* ``ids.py``: the job-id floor and the head's id, in files beside the database;
* ``schema.py``: the tables, and the columns added since a table's first release;
* ``base.py``: ``StoreBase``, the database itself: opened or refused, its transactions
  with their events lines, the id counter, backups, checks and restores;
* ``telemetry.py``, ``events.py``, ``nodes.py``, ``bookings.py``, ``pools.py``: one part
  of the ``Store`` each, over its own tables;
* ``accounting.py``: what a run is charged, users and quotas, the reports' sums;
* ``jobs.py``: a job's life, each step one transaction, and jobs read back (a run's end
  charges it: jobs build on accounting).

``Store`` is all the parts over one database; callers import it, its exceptions and
``spec_of`` from here.
"""

from .accounting import COUNTED_SQL, FINISHED_SQL
from .base import DatabaseDamaged, DatabaseNewer, StaleDecision, StoreUnavailable
from .bookings import Bookings
from .events import Events
from .ids import IdFloor, head_id_file, read_head_id
from .jobs import Jobs, spec_of
from .nodes import Nodes
from .pools import Pools
from .telemetry import DEFAULT_SPAN_S, Telemetry


class Store(Jobs, Pools, Bookings, Nodes, Telemetry, Events):
    """Durable state of the cluster: nodes, GPUs, jobs, allocations, users, events."""


__all__ = ["COUNTED_SQL", "DEFAULT_SPAN_S", "FINISHED_SQL", "DatabaseDamaged", "DatabaseNewer", "IdFloor",
           "StaleDecision", "Store", "StoreUnavailable", "head_id_file", "read_head_id", "spec_of"]
