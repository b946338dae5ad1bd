"""The `zns` command line."""

from zns.cli.app import main

__all__ = ["main"]
