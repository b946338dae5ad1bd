"""`python -m zns`: the `zns` command."""

from zns.cli import main

main(prog_name="zns")
