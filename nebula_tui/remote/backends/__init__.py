"""Vendor backends: parse what each vendor's tool printed into the shared model.

``PARSERS`` maps a kind name (as ``nebula parse KIND FILE`` takes it) to a function from
the tool's saved output to JSON-serialisable data.
"""

from __future__ import annotations

from . import nvidia, topo, xid

PARSERS = {**nvidia.PARSERS, "topo": topo.parse_topo, "xid": xid.parse_xid}
