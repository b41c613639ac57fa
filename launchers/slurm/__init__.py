"""What the Slurm backends share: settings, pure rendering, scheduler queries, and the base class owning poll/cancel."""
