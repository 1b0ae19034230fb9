"""An example turnkeep environment, outside the turnkeep package: key-value lookups through a tool."""

from turnkeep_example_lookup.env import LookupEnvironment, LookupOptions, sample_problem

__all__ = ["LookupEnvironment", "LookupOptions", "sample_problem"]
