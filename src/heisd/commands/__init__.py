"""Subcommands of the `heisd` command line (see heisd.cli)."""
