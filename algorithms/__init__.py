"""algorithms package of agentgym-opd."""
