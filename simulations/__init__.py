"""Simulated fleets on Flower's simulation engine (Ray): fleet files, the fleet runner with its
results, tables and plots, the one-board demo, and the launchers of `make run` (`flwr-run`,
`stop-superlink`, `ray-check`)."""
