"""What a run script checks as the job's user before the job starts, and what it activates.

The checks run on the node as the user the command will run as (``runuser``/``sudo`` when
``run_as: submitter``) and answer in one of two ways: exit 0 with facts on stdout, one
``key=value`` a line (``workdir``, ``conda``); or exit 1 with one sentence naming the
node, what is missing and what the node has, which becomes the job's reason for failing at
once, before any card is touched. Their inputs come as environment variables, never as
text inside the script.

Every path a user names is resolved by a process of that user (these checks, then the
job's own shell), never by root on the user's behalf, so a symlink leads only where the user
could go anyway. The one runtime that opens a path as root, a root container runtime's bind
mount, is given the source as the user opened it (``containers.pin_lines``, ``node/
mount_pins.py``): the check here is then only the early sentence, the pin the real test.

``CONDA_LOOKUP`` is the one place that says where a conda tool is looked for; the nodelet's
hello runs the same text to show what the node has.
"""

from __future__ import annotations

#: Where a conda tool lives when it is not on the non-login PATH an SSH command gets
#: (installers put it in the home and hook it into .bashrc, which `sh -c` never reads).
CONDA_DIRS = ("~/miniforge3/bin", "~/mambaforge/bin", "~/miniconda3/bin", "~/anaconda3/bin",
              "~/micromamba/bin", "~/.local/bin", "/opt/conda/bin", "/opt/miniforge3/bin",
              "/opt/miniconda3/bin", "/opt/anaconda3/bin", "/usr/local/bin")
_DIRS_SH = " ".join(d.replace("~", '"$HOME"', 1) for d in CONDA_DIRS)

#: Prints every conda tool found (conda first: mamba installs carry one), one path a line.
CONDA_LOOKUP = f"""for t in "${{CONDA_EXE:-}}" "${{MAMBA_EXE:-}}"; do [ -x "$t" ] && printf "%s\\n" "$t"; done
for name in conda micromamba mamba; do
  t=$(command -v "$name" 2>/dev/null) && [ -x "$t" ] && printf "%s\\n" "$t"
  for d in {_DIRS_SH}; do [ -x "$d/$name" ] && printf "%s\\n" "$d/$name"; done
done
exit 0"""

CHECKS = r"""say() { printf '%s\n' "$*"; }  # echo would read backslashes in paths
node=$NEBULA_NODE_NAME
me() { id -un 2>/dev/null || say "uid $(id -u)"; }  # for a refusal only: no id run per job
if [ -n "${NEBULA_WORKDIR:-}" ]; then
  cd -- "$NEBULA_WORKDIR" 2>/dev/null || {
    say "--workdir $NEBULA_WORKDIR does not exist on $node (or $(me) cannot enter it)"; exit 1; }
  printf 'workdir=%s\n' "$NEBULA_WORKDIR"
elif [ -n "${NEBULA_SUBMIT_DIR:-}" ] && cd -- "$NEBULA_SUBMIT_DIR" 2>/dev/null; then
  printf 'workdir=%s\n' "$NEBULA_SUBMIT_DIR"
elif [ -n "${NEBULA_SUBMIT_DIR+set}" ]; then
  printf 'workdir=%s\n' "$HOME"
fi
if [ -n "${NEBULA_TERMINAL:-}" ] && ! command -v script >/dev/null 2>&1; then
  say "$node has no script (util-linux), which gives an interactive job its terminal"; exit 1
fi
for src in "$@"; do
  [ -e "$src" ] || {
    say "--data-mount's source $src does not exist on $node (or $(me) cannot reach it)"; exit 1; }
done
if [ -n "${NEBULA_VENV:-}" ] && [ ! -f "$NEBULA_VENV/bin/activate" ]; then
  say "$node has no venv at $NEBULA_VENV (no bin/activate there for $(me)); make it with" \
       "python3 -m venv $NEBULA_VENV"
  exit 1
fi
[ -n "${NEBULA_CONDA:-}" ] || exit 0
tool=$(sh -c "$NEBULA_CONDA_LOOKUP" | head -n 1)
if [ -z "$tool" ]; then
  say "$node has no conda, mamba or micromamba for $(me) (looked on PATH and in" \
       "$NEBULA_CONDA_DIRS); install one there, or use --venv or --image"
  exit 1
fi
case $NEBULA_CONDA in
  /*) [ -d "$NEBULA_CONDA/conda-meta" ] || {
        say "$node has no conda env at $NEBULA_CONDA (no conda-meta there)"; exit 1; } ;;
  base) ;;
  *) envs=$("$tool" env list --json 2>/dev/null | sed -n 's/^ *"\(\/[^"]*\)",\{0,1\} *$/\1/p')
     found=
     for e in $envs; do [ "${e##*/}" = "$NEBULA_CONDA" ] && found=$e; done
     if [ -z "$found" ]; then
       names=$(for e in $envs; do case $e in */envs/*) printf '%s ' "${e##*/}" ;; esac; done)
       say "$node has no conda env $NEBULA_CONDA for $(me); its $tool has: base" \
            "${names:+$(printf '%s' "$names" | sed 's/ $//; s/ /, /g')}"
       exit 1
     fi ;;
esac
printf 'conda=%s\n' "$tool"
"""

#: Runs in the job's own shell right before its command: activate the conda env with the
#: tool the checks found (``$NEBULA_CONDA_TOOL``), or the venv, as ``activate`` would.
ACTIVATE = r"""if [ -n "${NEBULA_CONDA:-}" ]; then
  case ${NEBULA_CONDA_TOOL##*/} in
    conda) eval "$("$NEBULA_CONDA_TOOL" shell.posix hook)" && conda activate "$NEBULA_CONDA" ;;
    *) eval "$("$NEBULA_CONDA_TOOL" shell hook -s posix)" &&
         "${NEBULA_CONDA_TOOL##*/}" activate "$NEBULA_CONDA" ;;
  esac || { printf '%s\n' "nebula: $NEBULA_CONDA_TOOL could not activate $NEBULA_CONDA" >&2; exit 127; }
fi
if [ -n "${NEBULA_VENV:-}" ]; then
  VIRTUAL_ENV=$NEBULA_VENV; PATH="$NEBULA_VENV/bin:$PATH"; export VIRTUAL_ENV PATH
  unset PYTHONHOME
fi
"""


def check_env(node: str, workdir: str | None, submit_dir: str | None, conda: str | None,
              venv: str | None, terminal: bool = False) -> dict[str, str]:
    """The inputs of ``CHECKS`` (empty ones left out); ``terminal``: the command gets one
    through ``script`` (an interactive job)."""
    env = {"NEBULA_NODE_NAME": node}
    if terminal:
        env["NEBULA_TERMINAL"] = "1"
    if workdir:
        env["NEBULA_WORKDIR"] = workdir
    elif submit_dir is not None:
        env["NEBULA_SUBMIT_DIR"] = submit_dir
    if venv:
        env["NEBULA_VENV"] = venv
    if conda:
        env.update(NEBULA_CONDA=conda, NEBULA_CONDA_LOOKUP=CONDA_LOOKUP,
                   NEBULA_CONDA_DIRS=", ".join(d[:-len("/bin")] for d in CONDA_DIRS[:4]) + ", /opt/conda …")
    return env
