"""Shell completion: the bash and zsh scripts, and the words they ask for at Tab.

``nebula completion bash`` prints a script (made by shtab from the CLI's own parser, so
every command and flag is in it). Where a job id, node name or GPU goes, the script runs
``nebula __complete jobs|nodes|gpus``, which asks a service that already runs (it never
starts one) and prints nothing at all when none answers: a Tab never shows a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

#: What to complete, by the argument's name (``dest``), and which commands it fits.
_DYNAMIC = {"job": "jobs", "jobs": "jobs", "nodes": "nodes", "after": "jobs", "node": "nodes", "gpu": "gpus"}
#: Arguments of these commands name something new or something else (``node add NAME``,
#: ``sim throttle NODE INDEX``): they get no dynamic words.
_NOT_EXISTING = {("nebula node add", "node"), ("nebula sim throttle", "gpu"),
                 ("nebula sim inject xid", "gpu")}
#: A Tab should answer at once; a service slower than this gets no say.
_TIMEOUT_S = 2.0


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` ("bash" or "zsh")."""
    import shtab

    for prog, action in _actions(parser):
        kind = _DYNAMIC.get(action.dest)
        if kind and (prog, action.dest) not in _NOT_EXISTING:
            action.complete = _asks_service(kind)
    return shtab.complete(parser, shell=shell)


def _asks_service(kind: str) -> dict:
    """A shtab completer that runs ``nebula __complete KIND`` at each Tab (not once, when
    the script is loaded, which is what a word list in the script would do in zsh)."""
    function = f"_nebula_complete_{kind}"
    words = f'"$(nebula __complete {kind} 2>/dev/null)"'
    return {"bash": function, "zsh": function, "preamble": {
        "bash": f'{function}() {{ compgen -W {words} -- "$1"; }}',
        "zsh": f"{function}() {{ local -a words; words=(${{(f){words}}}); compadd -a words; }}",
    }}


def _actions(parser: argparse.ArgumentParser):
    """(prog, action) for every argument of ``parser`` and its sub-commands."""
    for action in parser._actions:
        yield parser.prog, action
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
                yield from _actions(sub)


def complete_words(argv: list[str]) -> int:
    """``nebula __complete KIND``: the words for KIND, one a line; always exits 0."""
    kind = argv[0] if argv else ""
    try:
        words = _words(kind)
    except Exception:  # noqa: BLE001 — a Tab must never print an error or a traceback
        words = []
    sys.stdout.write("".join(f"{w}\n" for w in words))
    return 0


def _words(kind: str) -> list[str]:
    from ..api import Client
    from ..homedir import Home

    host = os.environ.get("NEBULA_HOST")
    if host:
        from ..client.tunnel import open_tunnel

        with open_tunnel(host, os.environ.get("NEBULA_SOCKET"), timeout=_TIMEOUT_S) as tunnel:
            return _ask(Client(tunnel.local_socket, timeout=_TIMEOUT_S), kind)
    home = Home.resolve(None)
    if not home.socket.exists():
        return []
    return _ask(Client(home.socket, timeout=_TIMEOUT_S), kind)


def _ask(client, kind: str) -> list[str]:
    from ..wire import GpusReply, QueueReply, StatusReply

    with client:
        if kind == "jobs":
            return [str(j["id"]) for j in client.call("queue", QueueReply, timeout=_TIMEOUT_S)["jobs"]]
        if kind == "nodes":
            return [n["name"] for n in client.call("status", StatusReply, timeout=_TIMEOUT_S)["nodes"]]
        if kind == "gpus":
            return [f"{g['node']}:{g['index']}"
                    for g in client.call("gpus", GpusReply, timeout=_TIMEOUT_S)["gpus"]]
    return []
