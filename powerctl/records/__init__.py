"""The records the rooms hand each other: the profile table (`profile`, `powerctl.profile/1`), the
relation vector (`relation`, `powerctl.relation/1`), what one training step costs (`workload`) and a
chosen (batch size, GPU frequency) with its prediction (`pick`). They read and write their files
through `powerctl.files` and import nothing else of powerctl."""
