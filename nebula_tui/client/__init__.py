"""The client side, below both clients (the command line and the TUI): what reaches the
head service, ``service`` (find or start it), ``tunnel`` (``--host BOX``: its socket over
SSH) and ``attach`` (this terminal joined to a job's session through the head); and
``cluster``, what the TUI knows of the cluster, folded from the head's stream. Nothing here
imports ``head/``, ``cli/`` or ``screens/``, nor draws (no textual, no rich); importing the
package imports none of its modules.
"""
