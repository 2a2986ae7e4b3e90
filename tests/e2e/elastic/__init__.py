"""Elastic jobs under faults: workers that die, hang, leave and join; overlapping faults; the fault
soak; a job under abuse."""
