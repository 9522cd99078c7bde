"""The learning half: models, datasets and partitioning, fine-tune-to-target loop, LR scaling.
Uses powerctl's device interface; no Flower (docs/design/layout.md)."""
