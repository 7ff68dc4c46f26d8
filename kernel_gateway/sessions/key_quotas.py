"""What each API key holds, counted against its quotas before any kernel is taken; and
what it made, added to its usage (`tenants/usage.py`).

Sessions held are counted from the registry's sessions as they are (`held`: a key's
sessions, hibernated ones too, and their companions); stateless executions are counted
here, from the moment one is let in until its session is released. Past a quota the
request gets `QuotaExceeded`, naming it: nothing of another key's is reclaimed for it,
and the gateway-wide limits (`--max-sessions`, `--max-stateless`) still apply after it.
"""

from __future__ import annotations

from collections.abc import Callable

from kernel_gateway.errors import QuotaExceeded
from kernel_gateway.sessions.usage import UsageSink
from kernel_gateway.tenants.principal import ADMIN, Principal


class KeyQuotas:
    def __init__(
        self,
        held: Callable[[str], int],
        principals: Callable[[str], Principal] | None = None,
        usage: UsageSink | None = None,
    ) -> None:
        """`held`: the kernels a key id holds now; `principals`: a key's principal by its
        id, as it is now (its quotas), for calls made for a resource's owner by someone
        else (an E2B sandbox's own token)."""
        self._held = held
        self._principals = principals
        self._usage = usage
        self._stateless: dict[str, int] = {}
        """Stateless executions let in and not yet released, per key id."""
        self.disk_held: Callable[[str], int] | None = None
        """The disk a key's sessions hold now (the usage sampler's last samples)."""

    def principal(self, key_id: str | None) -> Principal:
        if key_id is None or self._principals is None:
            return ADMIN
        return self._principals(key_id)

    def check_session(self, owner: Principal) -> None:
        """Refuse one more session for `owner` past its `max_sessions`."""
        quota = owner.quotas.max_sessions
        if owner.key_id is not None and quota is not None and self._held(owner.key_id) >= quota:
            raise QuotaExceeded(
                f"key {owner.name!r} holds its quota of {quota} sessions (max_sessions; "
                "E2B sandboxes, their contexts, Jupyter kernels and MCP sessions count); "
                "delete one first"
            )
        total = owner.quotas.total_disk_bytes
        if owner.key_id is None or total is None or self.disk_held is None:
            return
        if (held := self.disk_held(owner.key_id)) >= total:
            raise QuotaExceeded(
                f"key {owner.name!r}'s sessions hold {held} bytes of disk, its quota "
                f"(total_disk_bytes {total}); delete files or sessions first"
            )

    def created(self, key_id: str | None) -> None:
        """A session of `key_id`'s was made: counted in its usage."""
        if self._usage is not None:
            self._usage.count(key_id, sessions=1)

    def take_stateless(self, owner: Principal) -> None:
        """Count one more stateless execution of `owner`'s, or refuse it past its
        `max_stateless`; `give_back` it when its session is released."""
        key, quota = owner.key_id, owner.quotas.max_stateless
        if key is None:
            return
        if quota is not None and self._stateless.get(key, 0) >= quota:
            raise QuotaExceeded(
                f"key {owner.name!r} runs its quota of {quota} stateless executions at once "
                "(max_stateless); retry when one ends",
                retry_after=1,
            )
        self._stateless[key] = self._stateless.get(key, 0) + 1
        if self._usage is not None:
            self._usage.count(key, stateless=1)

    def give_back(self, key_id: str | None, kernel_seconds: float = 0.0) -> None:
        """A stateless execution of `key_id`'s ended, its kernel held `kernel_seconds`
        (counted in its usage)."""
        if key_id is None:
            return
        if self._usage is not None and kernel_seconds > 0:
            self._usage.count(key_id, kernel_seconds=kernel_seconds)
        left = self._stateless.get(key_id, 0) - 1
        if left > 0:
            self._stateless[key_id] = left
        else:
            self._stateless.pop(key_id, None)
