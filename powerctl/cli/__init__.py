"""The `powerctl` command (`commands`: the parser and the device commands; `profile_command`;
`select_commands`: caps, select, pareto, cap-source, plot), the command-line behaviour every command of the
project shares (`util`: a user error is one line and exit status 2) and the profile heat maps (`plot`)."""

PROG = "powerctl"  # the command's name, in its usage line and its messages
