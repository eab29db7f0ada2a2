"""Attacks from the red-team pass (issue 16), one file per boundary; see docs/security.md."""
