"""Supervision: one pinned ``worker run`` per GPU (``launch``) and GPU leases in Redis for
``docker compose --scale`` (``lease``). Runs before torch is imported: may import only
``common``, never ``worker.pipelines`` or ``worker.serving``."""
