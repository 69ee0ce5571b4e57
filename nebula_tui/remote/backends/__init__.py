"""The head's own readers of vendor facts: ``nvidia`` (the model's values of an NVIDIA card)
and ``xid`` (the kernel log's Xid lines). The parsers the nodes run are ``node/backends/``.
"""
