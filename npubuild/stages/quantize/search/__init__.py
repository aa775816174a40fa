"""The mixed-precision search, in three parts: `measure.py` runs tables (the probe, or the integer
model itself) and remembers every result; `costs.py` prices a table on the target; `log.py` keeps
the path of runs and the best seen; `strategies.py` holds the search itself as functions over
those, which a stub probe can drive in tests. The `search` stage (stages/search.py) wires them up."""
