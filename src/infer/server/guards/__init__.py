"""What a connection or request must pass before the engine sees it: hosts, keys, sizes,
deadlines, counts of connections and requests in flight."""
