"""xDiT worker groups: N ranks under torchrun that make each image together.

``torchrun --nproc-per-node N -m worker.group --model M --queue Q [degrees]``. Rank 0 claims a
job with RQ and runs the ordinary job function; each time it needs images it broadcasts the
batch (prompts, seeds, settings, adapter) to every rank, all ranks run their part of the
parallel pipeline, every rank answers (images from the rank that holds them, or its error),
and rank 0 writes the files and finishes the job. Modules: ``config`` (degrees and the world
size), ``comm`` (the control plane), ``engine`` (one rank's pipeline), ``leader`` (rank 0),
``follower`` (the others), ``cli`` (start-up).
"""
