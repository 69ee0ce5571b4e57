#!/bin/sh
# Builds the head box's root filesystem for the box tests (tests/lab/test_box.py): a
# minimal Debian of this machine's release, made with debootstrap from Debian's mirror,
# with what docs/admin-guide.md needs on a head box (python3 and venv, ssh client, tmux,
# sudo). Cached outside the repository, in $NEBULA_BOX_CACHE (/var/cache/nebula-box), and
# built once: a second call only prints where it is. Needs root and debootstrap.
set -eu
cache=${NEBULA_BOX_CACHE:-/var/cache/nebula-box}
root="$cache/root"
configure() {  # cheap and idempotent: run on every call, so a cached root gets it too
    echo nebula-box >"$1/etc/hostname"
    grep -q nebula-box "$1/etc/hosts" 2>/dev/null ||
        printf '127.0.0.1\tlocalhost\n127.0.1.1\tnebula-box\n' >>"$1/etc/hosts"
    # make: the README's commands (test_box runs `make setup-demo` in it); added to a root
    # cached before it was in the list below
    [ -x "$1/usr/bin/make" ] || chroot "$1" sh -c 'apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make' \
        >/dev/null 2>&1 || echo "box: could not install make in $1" >&2
}
[ -f "$root/.nebula-box-ready" ] && { configure "$root"; echo "$root"; exit 0; }
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p; s/^deb \(http[^ ]*debian\) .*/\1/p' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
mirror=${mirror:-http://deb.debian.org/debian}
mkdir -p "$cache"
rm -rf "$root.tmp"
start=$(date +%s)
echo "box: debootstrap $suite from $mirror into $root (once; about 2 minutes)" >&2
debootstrap --variant=minbase \
    --include=systemd,systemd-sysv,dbus,python3,python3-venv,openssh-client,tmux,sudo,passwd,procps,iproute2,make \
    "$suite" "$root.tmp" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
    echo "box: debootstrap failed; see $cache/debootstrap.log" >&2; exit 1; }
# No getty or network setup of its own: the box shares the host's network.
rm -f "$root.tmp/etc/systemd/system/getty.target.wants/"* 2>/dev/null || true
configure "$root.tmp"
touch "$root.tmp/.nebula-box-ready"
mv "$root.tmp" "$root"
echo "box: root ready in $(( $(date +%s) - start )) s" >&2
echo "$root"
