"""Example training jobs, started by tests and the demo: they import the job-side libraries
(:mod:`collector.jobside`) exactly as a user's training job does."""
