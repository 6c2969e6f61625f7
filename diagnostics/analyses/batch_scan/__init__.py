"""The batch_scan analysis: its declaration here, its work in job.py."""
