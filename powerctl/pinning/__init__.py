"""A pinned GPU frequency goes back on every exit path: `freqstate`, `pinsession`, `safety`."""
