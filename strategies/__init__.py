"""Flower strategies: the power-aware FedAvg, the message protocol (train instructions, client
reports), the run settings, the fleet table, and the round records and summaries."""
