"""Plans, tactics, search backends and the `shardplan` command line."""
