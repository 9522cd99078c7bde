"""Choosing (batch size, GPU frequency) under a power cap, and staying under it: from profiles and
relation vectors to picks (`powerctl.records`); each module's doc says its part."""
