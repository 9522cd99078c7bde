"""A pinned GPU frequency goes back on every exit path: the on-disk record of the state before the pin
(`freqstate`), the session from first pin to restore (`pinsession`) and the exit and signal hooks
(`safety`)."""
