"""The store: the only package that speaks SQL (see ``base.py`` and ``jobs.py``)."""

from .base import DatabaseDamaged, StaleDecision, StoreUnavailable
from .ids import IdFloor, head_id_file, read_head_id
from .jobs import COUNTED_SQL, DEFAULT_SPAN_S, FINISHED_SQL, IDLE_UTIL_PCT, Store, spec_of

__all__ = ["COUNTED_SQL", "DEFAULT_SPAN_S", "FINISHED_SQL", "IDLE_UTIL_PCT", "DatabaseDamaged", "IdFloor",
           "StaleDecision", "Store", "StoreUnavailable", "head_id_file", "read_head_id", "spec_of"]
