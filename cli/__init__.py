"""The `scalelab` command: thin subcommands that call the other folders."""
