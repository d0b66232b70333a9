"""The commands of ``wardenctl``, grouped by what they need: the daemon, files, or a drill run.

Each ``cmd_*`` takes the parsed arguments and returns the exit status; ``jobwarden.control.cli``
builds the parser and dispatches to them.
"""
