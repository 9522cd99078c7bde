"""The `powerctl` command (`commands`, `profile_command`, `select_commands`), its figures (`plot`) and the
command-line behaviour every command of the project shares (`util`: a user error is one line, exit 2)."""

PROG = "powerctl"  # the command's name, in its usage line and its messages
