"""From a config to wired objects: the config's sources (config_source.py), the layout of the parallel
degrees (layout.py), the feature gate (feature_gate.py), optional libraries (optional_libs.py), and
compose.py, which applies every parallelism in its one order through one module per library
(dstp.py, dsmoe.py, autoep.py, dsdata.py, dspipe.py)."""
