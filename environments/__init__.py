"""environments package of agentgym-opd."""
