"""Secrets: credentials a session's code can use but never read (docs/secrets.md).

A secret is a name, a value, the domains it may be sent to, and optionally the header the
egress proxy adds to every request to those domains (`header`, `format`: `Bearer {value}`).
Its owner is the API key that made it (None: the admin): another key never sees it, and a
session names only its own key's secrets.

Stored in one file, `<runtime>/secrets.json`, written atomically; each value sealed with
AES-256-GCM under the operator's key (`--secrets-key-file`: any bytes, hashed to 32) and
its own random nonce, the record's id, owner and name as associated data (a sealed value
moved to another record does not open). Values are opened only where the egress relay
puts them into a request; nothing else (lists, logs, session records, snapshots, errors)
ever holds one. Without `--secrets-key-file` there are no secrets: the routes say how to
turn them on.

Each change bumps the secret's `version`; the relay reads the store at every request, so a
rotation takes effect on the next request of every session that uses it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from kernel_gateway.errors import Conflict, SecretNotFound, SecretsNotConfigured

FORMAT = 1
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
"""A secret's name: an environment variable's, as the sandbox sees its placeholder."""
MAX_SECRETS = 1000
MAX_VALUE_BYTES = 16 * 1024
PLACEHOLDER = "kg-secret:{name}"
"""What a session's environment holds for a secret (`E2B_PLACEHOLDER` works too)."""
E2B_PLACEHOLDER = "${{e2b.secrets.{name}}}"


def placeholder(name: str) -> str:
    return PLACEHOLDER.format(name=name)


@dataclass(frozen=True)
class Secret:
    id: str
    name: str
    owner: str | None
    domains: tuple[str, ...]
    header: str | None
    format: str
    version: int
    created_at: float
    updated_at: float
    sealed: str
    """nonce + AES-GCM ciphertext of the value, base64."""
    metadata: tuple[tuple[str, str], ...] = ()
    """E2B's customer metadata: what its SDK shows."""

    def to_json(self) -> dict[str, Any]:
        """As the API shows it: never the value, sealed or not."""
        return {
            "id": self.id,
            "name": self.name,
            "domains": list(self.domains),
            "header": self.header,
            "format": self.format,
            "version": self.version,
            "placeholder": placeholder(self.name),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "owner": self.owner,
        }

    def record(self) -> dict[str, Any]:
        return {**self.to_json(), "sealed": self.sealed, "metadata": dict(self.metadata)}

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Secret:
        return cls(
            id=str(data["id"]),
            name=str(data["name"]),
            owner=str(data["owner"]) if data.get("owner") else None,
            domains=tuple(str(d) for d in data["domains"]),
            header=str(data["header"]) if data.get("header") else None,
            format=str(data.get("format") or "{value}"),
            version=int(data["version"]),
            created_at=float(data["created_at"]),
            updated_at=float(data["updated_at"]),
            sealed=str(data["sealed"]),
            metadata=tuple((str(k), str(v)) for k, v in (data.get("metadata") or {}).items()),
        )


@dataclass(frozen=True)
class Opened:
    """A secret with its value, for the egress relay only."""

    name: str
    value: str
    domains: tuple[str, ...]
    header: str | None
    format: str


class SecretStore:
    """The secrets in `path`, sealed with the key in `key_file` (None: secrets are off)."""

    def __init__(self, path: Path, key_file: Path | None) -> None:
        self.path = path
        self._aead: AESGCM | None = None
        if key_file is not None:
            material = key_file.read_bytes()
            if len(material.strip()) < 16:
                raise ValueError(f"the secrets key file {key_file} holds under 16 bytes")
            self._aead = AESGCM(hashlib.sha256(material.strip()).digest())
        self._secrets: dict[str, Secret] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._aead is not None

    def open(self) -> None:
        """Read the file (its values stay sealed); a value the key cannot open fails here."""
        if self._aead is None or not self.path.exists():
            return
        data = json.loads(self.path.read_bytes())
        if data.get("format") != FORMAT:
            raise ValueError(f"{self.path}: unknown format {data.get('format')!r}")
        found = [Secret.from_record(r) for r in data["secrets"]]
        for secret in found:
            self._open(secret)  # the operator's key is the one they were sealed with
        self._secrets = {s.id: s for s in found}

    # -- what the API asks --------------------------------------------------------------------

    def visible(self, owner: str | None, admin: bool) -> list[Secret]:
        return sorted(
            (s for s in self._secrets.values() if admin or s.owner == owner),
            key=lambda s: (s.name, s.id),
        )

    def find(self, name: str, owner: str | None, admin: bool) -> Secret:
        """A secret by name (or id): the caller's own; the admin's view prefers its own,
        then any one of that name."""
        held = self._secrets
        by_id = held.get(name)
        if by_id is not None and (admin or by_id.owner == owner):
            return by_id
        mine = [s for s in held.values() if s.owner == owner and s.name == name]
        if mine:
            return mine[0]
        if admin:
            found = [s for s in held.values() if s.name == name]
            if len(found) > 1:
                raise Conflict(f"several keys have a secret named {name!r}: name it by its id")
            if found:
                return found[0]
        raise SecretNotFound(f"no secret {name!r}")

    def create(
        self,
        name: str,
        value: str,
        domains: list[str],
        header: str | None,
        format: str,
        owner: str | None,
        metadata: dict[str, str] | None = None,
    ) -> Secret:
        """A new secret; `domains` may be empty (E2B's: its sandboxes' rules say where it
        goes)."""
        aead = self._need()
        with self._lock:
            if any(s.name == name and s.owner == owner for s in self._secrets.values()):
                raise Conflict(f"a secret named {name!r} exists: rotate it (PUT) or delete it")
            if len(self._secrets) >= MAX_SECRETS:
                raise Conflict(f"the gateway holds {MAX_SECRETS} secrets, its most")
            now = time.time()
            secret_id = secret_id_of(owner, name)
            secret = Secret(
                secret_id,
                name,
                owner,
                tuple(domains),
                header,
                format,
                1,
                now,
                now,
                "",
                tuple((metadata or {}).items()),
            )
            secret = replace(secret, sealed=_seal(aead, secret, value))
            self._replace({**self._secrets, secret.id: secret})
            return secret

    def change(
        self,
        secret: Secret,
        value: str | None,
        domains: list[str] | None,
        header: str | None,
        format: str | None,
        metadata: dict[str, str] | None = None,
    ) -> Secret:
        """A new value (a rotation) and/or new domains, header, format; `version` + 1."""
        aead = self._need()
        with self._lock:
            current = self._secrets.get(secret.id)
            if current is None:
                raise SecretNotFound(f"no secret {secret.name!r}")
            old_value = self._open(current)
            changed = replace(
                current,
                domains=tuple(domains) if domains is not None else current.domains,
                header=header if header is not None else current.header,
                format=format if format is not None else current.format,
                metadata=tuple(metadata.items()) if metadata is not None else current.metadata,
                version=current.version + 1,
                updated_at=time.time(),
            )
            changed = replace(
                changed, sealed=_seal(aead, changed, value if value is not None else old_value)
            )
            self._replace({**self._secrets, changed.id: changed})
            return changed

    def delete(self, secret: Secret) -> None:
        with self._lock:
            if secret.id not in self._secrets:
                raise SecretNotFound(f"no secret {secret.name!r}")
            self._replace({k: v for k, v in self._secrets.items() if k != secret.id})

    # -- what the egress relay asks ------------------------------------------------------------

    def opened(self, names: tuple[str, ...], owner: str | None) -> list[Opened]:
        """The named secrets of `owner` with their values, as they are now (a session's:
        read at every request, so a rotation takes effect on the next one). A secret
        deleted since is left out: its placeholder is then sent to no one."""
        found = []
        held = self._secrets
        for name in names:
            secret = next((s for s in held.values() if s.name == name and s.owner == owner), None)
            if secret is not None:
                found.append(
                    Opened(name, self._open(secret), secret.domains, secret.header, secret.format)
                )
        return found

    def names_of(self, owner: str | None) -> set[str]:
        return {s.name for s in self._secrets.values() if s.owner == owner}

    # -- inside --------------------------------------------------------------------------------

    def _need(self) -> AESGCM:
        if self._aead is None:
            raise SecretsNotConfigured(
                "this gateway keeps no secrets: start it with --secrets-key-file (a file of "
                "random bytes the operator keeps; the secrets are sealed with it)"
            )
        return self._aead

    def _open(self, secret: Secret) -> str:
        aead = self._need()
        raw = base64.b64decode(secret.sealed)
        try:
            return aead.decrypt(raw[:12], raw[12:], _associated(secret)).decode()
        except InvalidTag:
            raise ValueError(
                f"the secret {secret.name!r} does not open with this --secrets-key-file"
            ) from None

    def _replace(self, secrets: dict[str, Secret]) -> None:
        """The store becomes `secrets`, on disk first (readers on the event loop see the old
        dict or the new one, never one changing under them)."""
        self._write(secrets)
        self._secrets = secrets

    def _write(self, secrets: dict[str, Secret]) -> None:
        data = {"format": FORMAT, "secrets": [s.record() for s in secrets.values()]}
        temporary = self.path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(data).encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)


def secret_id_of(owner: str | None, name: str) -> str:
    """A secret's id: the same on every node of a cluster (E2B's calls name it by id)."""
    digest = hashlib.sha256(f"{owner or ''}\0{name}".encode()).hexdigest()
    return "sec_" + digest[:20]


def _associated(secret: Secret) -> bytes:
    return f"{secret.id}\0{secret.owner or ''}\0{secret.name}".encode()


def _seal(aead: AESGCM, secret: Secret, value: str) -> str:
    nonce = os.urandom(12)
    return base64.b64encode(
        nonce + aead.encrypt(nonce, value.encode(), _associated(secret))
    ).decode()
