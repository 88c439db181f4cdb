"""What a training job imports: the step reporter (:mod:`.reporter`) and the checkpoint hook
(:mod:`.checkpoint_hook`). Standard library only (and ``core``'s stdlib-only modules), so a job
installs ``gpuwarden`` without extras and pulls in none of our dependencies; a test checks it."""
