"""Temporal activities: methods of classes built by each process's worker."""
