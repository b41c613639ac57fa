"""mbx login-node side: the CLI, campaign schema and sweep expansion, run store, collection."""
