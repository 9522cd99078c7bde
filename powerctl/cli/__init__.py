"""The `powerctl` command (`commands`), the command-line behaviour every command of the project shares
(`util`: a user error is one line and exit status 2) and the profile heat maps (`plot`)."""
