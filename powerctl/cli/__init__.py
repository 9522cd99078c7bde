"""The `powerctl` command, its figures (`plot`) and what every command shares (`util`: errors in one line)."""

PROG = "powerctl"  # the command's name, in its usage line and its messages
