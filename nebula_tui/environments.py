"""What a job runs in, as users write it: image references, data mounts, conda and venv names.

Pure checks, shared by the CLI (a usage error at submit, exit 2) and the service (a request
refused with the same sentence), so a bad value never reaches a node. Each check returns the
value in its one stored form or raises ``ValueError`` with a sentence naming what is wrong
and how to write it.
"""

from __future__ import annotations

import re

#: Container runtimes a node may have, in the order one is picked when the job names none.
RUNTIMES = ("podman", "docker", "apptainer", "singularity")
#: Runtimes that run an image file (``.sif``) or a ``library://``/``oras://`` reference.
FILE_RUNTIMES = ("apptainer", "singularity")
MAX_MOUNTS = 32
MAX_PATH = 4096

# The OCI distribution reference grammar: [registry[:port]/]path[:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_REFERENCE = re.compile(
    rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
_APPTAINER_SCHEMES = ("library://", "oras://", "shub://")
_CONDA_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,128}$")
_IMAGE_EXAMPLE = ("write it like pytorch/pytorch:2.1.0-cuda12.1-cudnn8, "
                  "docker://ubuntu:22.04 or /shared/images/train.sif")


def image_reference(text: str) -> str:
    """An image as a runtime takes it: an OCI reference (``docker://`` optional), an
    apptainer ``library://``/``oras://`` reference, or an absolute path to an image file."""
    if not isinstance(text, str) or not text or len(text) > 512 or not text.isprintable():
        raise ValueError(f"--image: {text!r} is not an image reference; {_IMAGE_EXAMPLE}")
    if text.startswith("/"):
        _absolute(text, "--image")
        return text
    if text.startswith(_APPTAINER_SCHEMES):
        rest = text.split("://", 1)[1]
        if rest and _REFERENCE.match(rest.lstrip("/")):
            return text
        raise ValueError(f"--image: {text!r} is not an image reference; {_IMAGE_EXAMPLE}")
    bare = text[len("docker://"):] if text.startswith("docker://") else text
    if not _REFERENCE.match(bare) or len(bare.split("@")[0].split(":")[0]) > 255:
        hint = " (image names are lower case)" if bare.lower() != bare and \
            _REFERENCE.match(bare.lower()) else ""
        raise ValueError(f"--image: {text!r} is not an image reference{hint}; {_IMAGE_EXAMPLE}")
    return text


def needs_file_runtime(image: str) -> bool:
    """Whether only apptainer/singularity can run this image (a file or their own scheme)."""
    return image.startswith("/") or image.startswith(_APPTAINER_SCHEMES)


def oci_name(image: str) -> str:
    """The reference podman and docker take (without the ``docker://`` transport)."""
    return image[len("docker://"):] if image.startswith("docker://") else image


def runtime_name(text: str) -> str:
    if text not in RUNTIMES:
        raise ValueError(f"--runtime: {text!r} is not a container runtime; "
                         f"use one of {', '.join(RUNTIMES)}")
    return text


def data_mount(text: str) -> str:
    """``SRC:DST`` or ``SRC:DST:ro``/``:rw``, both absolute, without ``..``; as given."""
    parts = text.split(":") if isinstance(text, str) else []
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"--data-mount: {text!r} is not SRC:DST or SRC:DST:ro "
                         "(absolute paths, no ':' in them)")
    _absolute(parts[0], "--data-mount's source")
    _absolute(parts[1], "--data-mount's target")
    if parts[1] == "/":
        raise ValueError("--data-mount: the target cannot be / itself; mount under a directory")
    return text


def split_mount(text: str) -> tuple[str, str, bool]:
    """(source, target, read-only) of a mount :func:`data_mount` accepted."""
    parts = text.split(":")
    return parts[0], parts[1], len(parts) == 3 and parts[2] == "ro"


def conda_env(text: str) -> str:
    """A conda env by name (``torch``) or by its prefix (an absolute path)."""
    if isinstance(text, str) and text.startswith("/"):
        _absolute(text, "--conda")
        return text
    if not isinstance(text, str) or not _CONDA_NAME.match(text):
        raise ValueError(f"--conda: {text!r} is not a conda env name; give its name "
                         "(letters, digits, . _ + -) or its absolute path")
    return text


def venv_path(text: str) -> str:
    return absolute(text, "--venv")


def absolute(path: str, what: str) -> str:
    """``path`` when it is absolute, printable, bounded and free of ``..``."""
    _absolute(path, what)
    return path


def _absolute(path: str, what: str) -> None:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"{what} must be an absolute path, not {path!r}")
    if len(path) > MAX_PATH or not path.isprintable():
        raise ValueError(f"{what} {path[:80]!r}… is too long or holds control characters")
    if ".." in path.split("/"):
        raise ValueError(f"{what} {path!r} must not contain '..'")


def combination(image: str | None, conda: str | None, venv: str | None,
                mounts: tuple[str, ...], runtime: str | None) -> None:
    """Refuse options that cannot go together, in one sentence."""
    if conda and venv:
        raise ValueError("--conda and --venv both activate an environment; give one")
    if image and (conda or venv):
        raise ValueError(f"{'--conda' if conda else '--venv'} activates an environment on the "
                         "node; a job with --image runs in the image's own environment")
    if mounts and not image:
        raise ValueError("--data-mount mounts into a container: add --image (a plain job "
                         "sees the node's files as they are)")
    if runtime and not image:
        raise ValueError("--runtime goes with --image")
    if len(mounts) > MAX_MOUNTS:
        raise ValueError(f"at most {MAX_MOUNTS} --data-mount per job")
