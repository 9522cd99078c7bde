"""Flower strategies (power-aware FedAvg and friends). Built in a later issue."""
