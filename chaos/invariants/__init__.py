"""The checks behind `chaos/verdict.py`, one module per family of DESIGN.md's invariants.

Every module derives its verdict from the audit log's events (what was admitted, sealed, cut,
restored, trained, held and released, and when), never from what the controller says about
itself where the events can tell; a check whose events a log lacks (a log from before they
were written) says "not checked" rather than fail.
"""
