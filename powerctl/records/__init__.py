"""The records the rooms hand each other (`profile`, `relation`, `workload`, `pick`)."""
