"""Simulated fleets on Flower's simulation engine (Ray): the fleet runner, the one-board demo, and the
launcher of `make run`."""
