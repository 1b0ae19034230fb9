"""Temporal workflows (snapshot attempts, the run workflow). They import only `schemas/`."""
