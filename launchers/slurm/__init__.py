"""What the Slurm backends share: settings, pure rendering, packing, scheduler queries, and the base class (the common
Slurm path as a template method: a backend fills its hooks)."""
