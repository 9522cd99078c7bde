"""The records the rooms hand each other: `profile`, `relation`, `workload`, `pick`; they read and write
their files through `powerctl.files` and import nothing else of powerctl."""
