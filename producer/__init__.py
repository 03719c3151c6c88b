"""The producer CLI: prompts files in, chunk jobs onto a Redis queue."""
