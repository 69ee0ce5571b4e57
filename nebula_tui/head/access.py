"""Who may do what on the head: admins, owners, and the sentences that refuse the rest.

Admins are root, the service's own account, ``cluster.admins`` and the members of
``cluster.admin_group``; a job's owner manages their own jobs. Every refusal names who may
do it instead, in one line.
"""

from __future__ import annotations

import grp
import pwd

from ..model import Job, RequestError
from .state import HeadState


def group_members(group: str) -> set[str]:
    """Users in a Unix group: its listed members and those for whom it is the primary group."""
    try:
        entry = grp.getgrnam(group)
    except KeyError:
        return set()
    return set(entry.gr_mem) | {p.pw_name for p in pwd.getpwall() if p.pw_gid == entry.gr_gid}


class Access:
    def __init__(self, state: HeadState):
        self.state = state

    def is_admin(self, user: str) -> bool:
        """Admins: root, the service's own account, the config's admins and admin_group."""
        config = self.state.config
        if user in ("root", self.state.owner) or user in config.admins:
            return True
        return bool(config.admin_group) and user in group_members(config.admin_group or "")

    def sees_commands_of_all(self, user: str) -> bool:
        """Whether ``user`` sees every job's command line, not only their own jobs'."""
        return self.state.config.commands_visible_to == "everyone" or self.is_admin(user)

    def may_manage(self, user: str, job: Job) -> bool:
        return user == job.user or self.is_admin(user)

    def admin_names(self) -> list[str]:
        """The admins named by account (not the group's members), sorted."""
        return sorted({"root", self.state.owner, *self.state.config.admins})

    def admins_text(self) -> str:
        group = self.state.config.admin_group
        return ", ".join(self.admin_names()) + (f", group {group}" if group else "")

    def check_may_manage(self, user: str, job: Job, verb: str) -> None:
        """Raise RequestError unless ``user`` may ``verb`` ``job`` (cancel, hold, attach to…)."""
        if not self.may_manage(user, job):
            raise RequestError(f"job {job.id} belongs to {job.user}; only they or an admin "
                               f"({self.admins_text()}) may {verb} it")

    def check_admin(self, user: str, what: str) -> None:
        """Raise RequestError unless ``user`` is an admin; ``what`` completes "may …"."""
        if not self.is_admin(user):
            raise RequestError(f"only an admin ({self.admins_text()}) may {what}")
