"""Running and recording a campaign: feasibility, the engine and its retries, the run store, collection, gates."""
