"""Parsers of vendor tool output, shipped to the nodes: each tool's text as vendor-neutral
readings. ``reading`` holds the shape every parser yields; one module per tool family
(``nvidia_smi``, ``amd``, ``intel``, ``ascend``, ``topo``), pure and stdlib only.
``remote/documents.py`` maps ``nebula parse`` kinds onto them.

Nothing is imported here: the nodes load these modules one by one, without the head's.
"""
