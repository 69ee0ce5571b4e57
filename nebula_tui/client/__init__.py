"""What every client (the command line and the TUI) uses to reach the head service:
``service`` (find or start it), ``tunnel`` (``--host BOX``: its socket over SSH) and
``attach`` (this terminal joined to a job's session through the head). Nothing here imports
``head/``, ``cli/`` or ``screens/``; importing the package imports none of its modules.
"""
