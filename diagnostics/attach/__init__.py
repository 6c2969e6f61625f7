"""Attach mode's runtime: the bootstrap and agent that run inside the user's job, the command check,
the launcher session and the dashboard's background run (docs/attach.md). The analysis of a run folder
is diagnostics.analyses.attach."""
