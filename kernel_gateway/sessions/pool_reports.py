"""What `/health` and `/languages` report of the sessions' pools."""

from __future__ import annotations

from kernel_gateway.sessions.registry import Registry
from kernel_gateway.shapes.responses import LanguageInfo, StatelessMode


def languages_json(registry: Registry) -> list[LanguageInfo]:
    """Each language served, Python first, with its version and its pool's numbers."""
    out: list[LanguageInfo] = []
    for name, language in registry.languages.items():
        pool = registry.pools.get(name)
        warm = pool.stats() if pool is not None else None
        out.append(
            {
                "name": language.name,
                "display_name": language.display_name,
                "version": language.version,
                "image": language.image,
                "interrupt_mode": language.interrupt_mode,
                "pool": {
                    "warm": warm["warm"] if warm is not None else 0,
                    "starting": warm["starting"] if warm is not None else 0,
                    "target": warm["target"] if warm is not None else 0,
                },
            }
        )
    return out


def stateless_stats(registry: Registry) -> StatelessMode:
    """How stateless requests get kernels, for /health."""
    if registry.forks is None:
        return {"stateless_mode": "container"}
    return {"stateless_mode": "fork", "fork_servers": registry.forks.stats()}
