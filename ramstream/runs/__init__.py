"""Running merges to finished outputs: what ``merge`` (one output) and ``sweep`` (K) share."""
