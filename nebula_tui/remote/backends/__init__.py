"""Parsers of vendor tool output: each tool's text as vendor-neutral readings.

``reading`` holds the shape every parser yields; one module per tool family (``nvidia_smi``,
``amd``, ``intel``, ``ascend``, ``topo``) is pure, stdlib only and travels to the nodes with
the nodelet (``remote/shipping.py``). ``nvidia`` and ``xid`` are the head's (model values,
the kernel log). ``remote/documents.py`` maps ``nebula parse`` kinds onto them.

Nothing is imported here: the nodes load these modules one by one, without the head's.
"""
