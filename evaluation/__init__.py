"""evaluation package of agentgym-opd."""
