"""The verdict kinds: every module here is one kind, named as the kind and its campaign key, registered with
judge.verdict_kinds.register."""
