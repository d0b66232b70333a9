"""The control socket's server and its command handlers."""
