"""The trainer kinds: every module here is one kind, named as the kind, registered with trainers.registry.register."""
