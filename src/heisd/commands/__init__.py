"""Subcommands of the `heisd` command line: one module each, dispatched by `heisd.commands.runner`."""
