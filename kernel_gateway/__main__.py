"""`python -m kernel_gateway`: the `kernel-gateway` command (see `cli/main.py`)."""

from __future__ import annotations

from kernel_gateway.cli.main import run

if __name__ == "__main__":
    run()
