"""experience_bank package of agentgym-opd."""
