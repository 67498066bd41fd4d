"""The ``duet`` command: one module per group of subcommands, and what they share."""
