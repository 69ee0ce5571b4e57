"""The shell lines of a run script that run a job in a container (R24).

Pure text building for ``launcher.run_script``: which runtime a node uses for an image,
the pull (shown as the job's phase; a failure ends the job with the runtime's own words),
and the ``podman run`` / ``docker run`` / ``apptainer exec`` argv with only the allocated
devices, passed the vendor's way. Every user-given word (image, paths, environment values)
is quoted with ``shlex.quote``; the few values only the node knows (a user's uid, a card's
render node, which driver files exist) are found by fixed shell code at launch.

The container is named ``nebula-<job>-<digest>`` (a digest of this launch's token, from the job's
directory), and its name and the runtime's argv are written to ``$jobdir/container`` (one
word a line, the name first), so the nodelet can signal and stop it by name: its processes
are children of the runtime's monitor, not of the tmux session.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from importlib import resources

from .. import environments
from ..model import DEFAULT_VENDOR
from . import vendors

#: /dev/shm in the container: Docker's 64 MB default breaks PyTorch's DataLoader workers.
SHM_SIZE = "8g"
#: The pinning of data mounts (``node/mount_pins.py``), run by the wrapper as root with the
#: node's python3 when a root runtime mounts a job user's paths.
PINS_SOURCE = ((resources.files("nebula_tui.node") / "mount_pins.py").read_text()
               + "\npins_main(sys.argv)\n")
_PCI = re.compile(r"^(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


@dataclass(frozen=True)
class Device:
    """One allocated card, as a container needs it: NVIDIA by UUID, Ascend by index, AMD
    and Intel by the render node of the card at ``pci_bus_id``."""

    uuid: str
    index: int
    vendor: str = DEFAULT_VENDOR
    pci_bus_id: str | None = None


class NoRuntime(Exception):
    """The node cannot run this image; ``str()`` is the sentence the job fails with."""


def choose_runtime(node: str, image: str, have: tuple[str, ...], asked: str | None,
                   pinned: str | None) -> str:
    """The runtime for ``image`` on ``node``: the job's ``--runtime``, else the node's
    pinned one (nodes.yaml), else the first the node has that can run it."""
    fits = environments.FILE_RUNTIMES if environments.needs_file_runtime(image) \
        else environments.RUNTIMES
    has = f"it has {', '.join(have)}" if have else "it has none"
    for wanted, why in ((asked, "--runtime"), (pinned, f"nodes.yaml's runtime for {node}")):
        if wanted is None:
            continue
        if wanted not in have:
            raise NoRuntime(f"{node} has no {wanted} ({why}); {has}")
        if wanted not in fits:
            raise NoRuntime(f"{wanted} cannot run {image} on {node}: an image file or "
                            f"library:// reference needs apptainer or singularity")
        return wanted
    for name in environments.RUNTIMES:
        if name in have and name in fits:
            return name
    raise NoRuntime(f"{node} has no container runtime that can run {image} "
                    f"({' or '.join(fits)}); {has}")


def sysfs_pci(pci_bus_id: str) -> str:
    """nvidia-smi's ``00000000:03:00.0`` as sysfs names it: ``0000:03:00.0``."""
    if not _PCI.match(pci_bus_id):
        raise ValueError(f"not a PCI address: {pci_bus_id!r}")
    parts = pci_bus_id.lower().split(":")
    domain = parts[0][-4:] if len(parts) == 3 else "0000"
    return f"{domain}:{parts[-2]}:{parts[-1]}"


def container_env(env: dict[str, str], devices: tuple[Device, ...]) -> dict[str, str]:
    """The job's variables as seen inside a container that holds only its cards: each
    vendor's renumbered over that vendor's cards, as the vendors' table says ("uuid": the
    cards' UUIDs in allocation order, "order": 0…k-1)."""
    inside = dict(env)
    for vendor in vendors.VENDORS:
        mine = [d for d in devices if d.vendor == vendor.name]
        for variable in vendor.visibility:
            if variable.inside is None or variable.name not in inside:
                continue
            numbers = ([d.uuid for d in mine] if variable.inside == "uuid"
                       else [str(i) for i in range(len(mine))])
            inside[variable.name] = variable.prefix + ",".join(numbers)
    return inside


def q(words) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


# `ADD words` appends to the argv built in "$@" (a function cannot: it has its own "$@").
ADD = 'set -- "$@"'
# Shell helpers the lines below use (fixed text, no user-given word): `render_of PCI`
# prints the card's render node.
HELPERS = r"""dev_root=${NEBULA_DEV_ROOT:-}  # a tree standing in for / (the simulated lab's devices)
render_of() {
  for n in "$dev_root/sys/bus/pci/devices/$1/drm/"renderD*; do
    [ -e "$n" ] && { echo "/dev/dri/${n##*/}"; return 0; }
  done
  return 1
}
"""


def podman_lines(runtime: str, image: str, env: dict[str, str], devices: tuple[Device, ...],
                 node: str, workdir: str | None, mounts: tuple[str, ...], user: str | None,
                 prefix: tuple[str, ...], rootless: bool, interactive: bool,
                 pin: bool = False, by_name: bool = False) -> list[str]:
    """podman or docker: pull if missing, then ``run`` named after the job.

    ``user``: the node user whose uid and gid the command runs as (None: the login user);
    ``rootless``: podman runs as ``prefix``'s user and maps its own uid in instead;
    ``pin``: the runtime runs as root for ``user``, so it is given the data mounts' sources
    as ``user`` opened them (:func:`pin_lines`), never their paths; ``by_name``: the runtime
    inherits the wrapper's environment, so the job's variables are exported and named
    (``-e NAME``), their values never on the runtime's command line, which every user of
    the node can read.
    """
    ref = environments.oci_name(image)
    tool = q([*prefix, runtime])
    exists = (f"{tool} image exists {shlex.quote(ref)}" if runtime == "podman" else
              f"{tool} image inspect {shlex.quote(ref)} >/dev/null 2>&1")
    lines = [
        f"if ! {exists}; then",
        f"  phase {shlex.quote(f'pulling image {ref}')}",
        f"  if ! pulled=$({tool} pull {shlex.quote(ref)} 2>&1); then",
        '    printf "%s\\n" "$pulled"',
        "    why=$(printf '%s\\n' \"$pulled\" | sed -n '/./h; ${x;s/^Error: //;p;}')",
        f"    fail {shlex.quote(f'pulling {ref} on {node} failed: ')}\"$why\"",
        "  fi",
        "  phase ''",
        "fi",
        # named for this launch by a digest of its token: the name is on command lines
        'name="nebula-$job-$(sha256sum < "$jobdir/token" | cut -c 1-24)"',
        f"printf '%s\\n' \"$name\" {q([*prefix, runtime])} > \"$jobdir/container\"",
        # no-new-privileges: a rootful runtime starts the command by the job's user's uid,
        # and a setuid-root program of the image must not make it root again (root in the
        # container reads every host file its data mounts show).
        f"set -- {tool} run --rm --name \"$name\" --init --network host --shm-size {SHM_SIZE} "
        "--log-driver none --pull never --security-opt no-new-privileges",
    ]
    if interactive:
        lines.append(f"{ADD} -i -t")
    if rootless and runtime == "podman":
        lines.append(f"{ADD} --userns keep-id")
    else:  # the job's user (None: the login user's own) by uid and gid
        who = f" {shlex.quote(user)}" if user else ""
        lines.append(f"{ADD} --user \"$(id -u{who}):$(id -g{who})\"")
    for name, value in container_env(env, devices).items():
        lines.append(f"export {shlex.quote(f'{name}={value}')}; {ADD} -e {name}" if by_name
                     else f"{ADD} -e {shlex.quote(f'{name}={value}')}")
    # Variables the node's own environment names for every container (an admin's proxy;
    # the simulated lab's node directory), passed from the runtime's environment.
    lines.append('for v in $(printf "%s" "${NEBULA_CONTAINER_PASSENV:-}" | tr : " "); do '
                 f'{ADD} -e "$v"; done')
    if workdir:  # inside the container: the runtime resolves it in the image's own tree
        lines.append(f"{ADD} -w {shlex.quote(workdir)}")
    if pin and mounts and user:
        lines += pin_lines(user, node, mounts)
    else:
        for mount in mounts:
            src, dst, ro = environments.split_mount(mount)
            lines.append(f"{ADD} -v {shlex.quote(f'{src}:{dst}' + (':ro' if ro else ''))}")
    lines += device_lines(runtime, devices, node)
    lines.append(f"{ADD} {shlex.quote(ref)}")
    return lines


def pin_lines(user: str, node: str, mounts: tuple[str, ...]) -> list[str]:
    """The data mounts of a root runtime: each source opened as ``user`` and bound at
    ``$jobdir/mnt/N`` (``mount_pins.py`` says why), the runtime given those paths. A source
    the user cannot reach ends the job with one sentence; :data:`RELEASE_PINS` undoes it."""
    sources = [environments.split_mount(m)[0] for m in mounts]
    lines = [f"pins_py={shlex.quote(PINS_SOURCE)}",
             f'if ! pinned=$(python3 -c "$pins_py" pin "$jobdir/mnt" {q([user, node, *sources])} 2>&1); then',
             '  fail "$(printf \'%s\\n\' "$pinned" | tail -n 1)"',
             "fi"]
    for n, mount in enumerate(mounts):
        _, dst, ro = environments.split_mount(mount)
        lines.append(f'{ADD} -v "$jobdir/mnt/{n}:"{shlex.quote(dst + (":ro" if ro else ""))}')
    return lines


#: After a pinned container's runtime returned: its staging mounts go, its exit code stays.
RELEASE_PINS = 'set -- $?; python3 -c "$pins_py" release "$jobdir/mnt" >/dev/null 2>&1; (exit "$1")'


def device_lines(runtime: str, devices: tuple[Device, ...], node: str) -> list[str]:
    """The allocated cards, and only those, the vendor's way (``vendors.VENDORS``) for
    podman or docker: CDI cards first, each vendor's shared devices, every card in
    allocation order, then the managers and driver files."""
    lines: list[str] = []
    present = vendors.present(d.vendor for d in devices)
    way = {v.name: v.card_device for v in present}
    cdi = [d for d in devices if way.get(d.vendor) == "cdi"]
    if cdi and runtime == "docker":
        # Docker's --gpus reads a CSV list: several devices need the inner quotes.
        lines.append(f"{ADD} --gpus {shlex.quote(chr(34) + 'device=' + ','.join(d.uuid for d in cdi) + chr(34))}")
    elif cdi:
        lines += [f"{ADD} --device {shlex.quote(f'nvidia.com/gpu={d.uuid}')}" for d in cdi]
    for path in (p for v in present for p in v.shared_devices):
        lines.append(f'{ADD} --device "$dev_root{path}:{path}" '
                     f'--group-add "$(stat -c %g "$dev_root{path}")"')
    for d in devices:
        if way.get(d.vendor) == "render":
            if not d.pci_bus_id:
                why = f"{node} did not report the PCI address of GPU {d.index}, so its render device is unknown"
                lines.append(f"fail {shlex.quote(why)}")
                continue
            pci = sysfs_pci(d.pci_bus_id)
            missing = f"{node} has no render device for GPU {d.index} (no /sys/bus/pci/devices/{pci}/drm/renderD*)"
            lines += [f"r=$(render_of {shlex.quote(pci)}) || fail {shlex.quote(missing)}",
                      f'{ADD} --device "$dev_root$r:$r" --group-add "$(stat -c %g "$dev_root$r")"']
        elif way.get(d.vendor) == "davinci":
            lines.append(f"{ADD} --device \"$dev_root/dev/davinci{int(d.index)}:/dev/davinci{int(d.index)}\"")
    for vendor in present:
        for path in vendor.manager_devices:
            lines.append(f"{ADD} --device \"$dev_root{path}:{path}\"")
        for path in vendor.driver_mounts:
            lines.append(f"[ -e \"$dev_root{path}\" ] && {ADD} -v \"$dev_root{path}:{path}:ro\"")
    return lines


def apptainer_lines(runtime: str, image: str, env: dict[str, str], devices: tuple[Device, ...],
                    node: str, workdir: str | None, mounts: tuple[str, ...],
                    prefix: tuple[str, ...]) -> list[str]:
    """apptainer/singularity ``exec``: as the job's user, with a clean environment plus the
    job's. The cards come in by ``--nv``/``--rocm`` (which bind the vendor's devices and
    libraries); the job's visibility variables, with the node's numbering, pick its own."""
    lines = []
    if image.startswith("/"):  # looked for as the job's user: root would see every path
        # (through `env`: the sudoers rule a non-root login needs allows only that)
        lines.append(f"{q([*prefix, *(['env'] if prefix else []), 'test', '-e', image])} || fail "
                     f"{shlex.quote(f'{node} has no image file {image} (or the job user cannot reach it)')}")
    lines.append(f"set -- {q([*prefix, runtime])} exec --cleanenv")
    for vendor in vendors.present(d.vendor for d in devices):
        if vendor.apptainer_flag:
            lines.append(f"{ADD} {vendor.apptainer_flag}")
        for path in vendor.driver_mounts:
            lines.append(f"[ -e {path} ] && {ADD} --bind {path}:{path}:ro")
    # Through runuser (or none) the runtime inherits the wrapper's environment: the values
    # go as <RUNTIME>ENV_NAME variables, which --cleanenv keeps, and on no command line.
    by_name = prefix[:1] in ((), ("runuser",))
    for name, value in env.items():
        lines.append(f"export {shlex.quote(f'{runtime.upper()}ENV_{name}={value}')}" if by_name
                     else f"{ADD} --env {shlex.quote(f'{name}={value}')}")
    if workdir:
        lines.append(f"{ADD} --pwd {shlex.quote(workdir)}")
    for mount in mounts:
        src, dst, ro = environments.split_mount(mount)
        lines.append(f"{ADD} --bind {shlex.quote(f'{src}:{dst}' + (':ro' if ro else ''))}")
    lines.append(f"{ADD} {shlex.quote(image)}")
    return lines
