"""``nebula``'s command line, one module per command family. Thin: each command calls the
service.

Conventions every command follows:

* errors are one line on stderr: usage errors exit 2 and name the sub-command's own
  ``--help`` (with "did you mean …?" for a mistyped command, choice or flag), refusals by
  the service exit 1;
* every command that prints data takes ``--json`` (shapes: docs/reference.md, "JSON output");
* output may go to a pipe that closes early (``| head``): the command stops quietly;
* ``--host BOX`` (or ``NEBULA_HOST``) runs the command against the service on another
  machine, over SSH (``client/tunnel.py``); only then is asyncssh imported.

The house: ``args`` (the one-line parser, flag value types) ◂ ``parser`` (the grammar) and
``common`` (the service connection, ``--json`` output) ◂ the families: ``jobs``, ``logs``,
``cluster`` (overview, nodes, GPUs), ``accounting`` (history, report, users, quota),
``local`` (parse, completion, serve, demo, TUI; ``completion`` and ``demo`` do the work of
two of them), ``sim`` (the simulated lab's faults) ◂
``main`` (dispatch, errors, exit codes). Nothing imports this package's ``__init__``.
"""

from .main import main
from .parser import build_parser

__all__ = ["build_parser", "main"]
