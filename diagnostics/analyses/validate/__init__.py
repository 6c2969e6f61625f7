"""The validate analysis: its declaration here, its work in job.py."""
