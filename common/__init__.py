"""What the producer and the worker share: job specs, settings, queue naming, output naming, presets."""
