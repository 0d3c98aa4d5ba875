"""The two passes over the blocks: probe (statistics into the index) and merge (into shards)."""
