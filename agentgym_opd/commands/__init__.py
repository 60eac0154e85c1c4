"""Subcommand modules of `agentgym-opd` found through the `agentgym_opd.commands` entry-point group."""
