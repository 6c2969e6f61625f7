"""The command line: ``python -m diagnostics <command>``; subcommands come from the registry."""
