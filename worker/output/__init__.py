"""Output: images and metadata written so that a crash never leaves a half-written file, free
space and write probes (``images``). May import only ``common``."""
