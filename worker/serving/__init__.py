"""The RQ side of a worker: the in-process RQ worker (``rqworker``) built from parts (``parts``:
``signals``' stops, ``pause``, ``give_backs``, ``keeper``, ``overlap``'s tails), the job function
it runs (``task``), what the job can reach of its worker (``runtime``), dead-worker recovery
(``recovery``), failure classes (``failures``) and the model/adapter circuit breaker (``breaker``).

May import ``common``, ``worker.pipelines`` and ``worker.output``; nothing imports it but the
CLI, ``worker.task`` and ``worker.group`` (rank 0 is an ordinary diffq RQ worker)."""
