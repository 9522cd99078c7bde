"""A pinned GPU frequency goes back on every exit path: the on-disk record (`freqstate`), the session
(`pinsession`) and the exit and signal hooks (`safety`)."""
